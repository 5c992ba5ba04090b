//! Grouped bars, drawn with `plotters` into any drawing area: one group per category along x,
//! one bar per series inside a group, the value written above each bar, an optional min-max
//! whisker, and "n/m" (not measured) where a value is missing. Every figure uses this one
//! drawing so that they all look alike.

use plotters::coord::Shift;
use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// The font family of every text: the SVG names it and the viewer picks the font.
pub(crate) const FONT: &str = "sans-serif";

/// The size of group labels, in `plotters`' units (the SVG backend writes 1/1.24 of it as
/// the font size in pixels).
const LABEL_SIZE: u32 = 14;

/// Series colours, in order (colour-blind friendly: the Okabe-Ito palette, without yellow).
pub(crate) const PALETTE: [RGBColor; 6] = [
    RGBColor(0, 114, 178),   // blue
    RGBColor(213, 94, 0),    // vermillion
    RGBColor(0, 158, 115),   // bluish green
    RGBColor(204, 121, 167), // reddish purple
    RGBColor(86, 180, 233),  // sky blue
    RGBColor(230, 159, 0),   // orange
];

/// The colour of the `i`-th series (or group), repeating the palette when there are more.
pub(crate) fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// How values map to height.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scale {
    /// From zero, linear.
    Linear,
    /// Logarithmic, for values that span decades; bars start at the axis' lower end.
    Log,
}

/// Which index picks a bar's colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ColorBy {
    /// Every bar of one series has that series' colour (the usual grouped bars, with legend).
    Series,
    /// Every bar of one group has that group's colour (one series, named by the groups).
    Group,
}

/// One bar: its value, an optional range drawn as a whisker, and a mark after its label.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bar {
    /// The bar's height.
    pub(crate) value: f64,
    /// The whisker's ends (e.g. the smallest and largest of several runs), if any.
    pub(crate) range: Option<(f64, f64)>,
    /// Appended to the value label (e.g. `*` for a footnote).
    pub(crate) mark: &'static str,
}

impl Bar {
    /// A bar of `value` without whisker or mark.
    pub(crate) fn new(value: f64) -> Bar {
        Bar {
            value,
            range: None,
            mark: "",
        }
    }
}

/// A grouped bar chart.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Chart {
    /// The caption above the chart.
    pub(crate) title: String,
    /// The y axis' description.
    pub(crate) y_desc: String,
    /// The categories along x.
    pub(crate) groups: Vec<String>,
    /// The bars of each group, named in the legend.
    pub(crate) series: Vec<String>,
    /// `values[group][series]`; `None` is drawn as "n/m" (not measured).
    pub(crate) values: Vec<Vec<Option<Bar>>>,
    /// Linear or logarithmic y.
    pub(crate) scale: Scale,
    /// Whether bars take their series' or their group's colour.
    pub(crate) color_by: ColorBy,
    /// Whether to draw the legend of the series.
    pub(crate) legend: bool,
    /// Lines kept under the axis for the group labels, at least (charts side by side align
    /// their axes when they keep the same number).
    pub(crate) label_lines: usize,
}

/// A drawing error, as text (the backends' error types differ).
pub(crate) type DrawResult = Result<(), String>;

/// Turns any `plotters` error into the text of a [`DrawResult`].
pub(crate) fn draw_err<E: std::fmt::Display>(e: E) -> String {
    format!("drawing failed: {e}")
}

/// A value as a short label: `186k`, `8.5k`, `42.1`, `0.25`, `0`.
pub(crate) fn compact(v: f64) -> String {
    let a = v.abs();
    let (scaled, suffix) = if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e4 {
        (v / 1e3, "k")
    } else if a >= 1e3 {
        // Four digits fit: 9,998 rather than a rounded 10k.
        let n = v.round() as i64;
        let sign = if n < 0 { "-" } else { "" };
        let n = n.unsigned_abs();
        return format!("{sign}{},{:03}", n / 1000, n % 1000);
    } else {
        (v, "")
    };
    let s = scaled.abs();
    let text = if s == 0.0 {
        "0".to_owned()
    } else if s >= 100.0 {
        format!("{scaled:.0}")
    } else if s >= 10.0 || !suffix.is_empty() {
        format!("{scaled:.1}")
    } else if s >= 1.0 {
        format!("{scaled:.2}")
    } else {
        format!("{scaled:.3}")
    };
    // 10.0k reads better as 10k, 2.50 as 2.5.
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    };
    format!("{text}{suffix}")
}

/// Splits `label` at spaces into lines of at most `width` characters (a longer word keeps its
/// own line).
pub(crate) fn wrap(label: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in label.split_whitespace() {
        match lines.last_mut() {
            Some(line) if line.chars().count() + 1 + word.chars().count() <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_owned()),
        }
    }
    lines
}

/// The y range to draw, keeping the fraction `top` (below 1) of the height free above the
/// tallest bar or whisker for its label and the legend: linear from 0, log from the decade
/// below the smallest positive value.
fn y_range(chart: &Chart, top: f64) -> (f64, f64) {
    let top = top.clamp(0.0, 0.8);
    let mut values = chart
        .values
        .iter()
        .flatten()
        .flatten()
        .flat_map(|b| [Some(b.value), b.range.map(|r| r.0), b.range.map(|r| r.1)])
        .flatten();
    match chart.scale {
        Scale::Linear => {
            let max = values.fold(0.0_f64, f64::max);
            (0.0, if max > 0.0 { max / (1.0 - top) } else { 1.0 })
        }
        Scale::Log => {
            let (mut lo, mut hi) = (f64::INFINITY, 0.0_f64);
            for v in values.by_ref().filter(|v| *v > 0.0) {
                lo = lo.min(v);
                hi = hi.max(v);
            }
            if !lo.is_finite() {
                return (1.0, 10.0);
            }
            let lo_log = lo.log10().floor();
            let span = (hi.log10() - lo_log).max(0.5);
            (10f64.powf(lo_log), 10f64.powf(lo_log + span / (1.0 - top)))
        }
    }
}

/// Draws `chart` into `area`.
pub(crate) fn draw<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, chart: &Chart) -> DrawResult {
    let (width, height) = area.dim_in_pixel();
    let groups = chart.groups.len().max(1);
    // Characters that fit under a group at the label font (about 0.55 em per character).
    let em = f64::from(LABEL_SIZE) / 1.24;
    let label_chars = ((f64::from(width) - 70.0) / groups as f64 / (em * 0.55)).max(6.0) as usize;
    let label_lines = chart
        .groups
        .iter()
        .map(|g| wrap(g, label_chars).len())
        .max()
        .unwrap_or(1)
        .max(chart.label_lines)
        .max(1);
    // Room above the bars: a value label, and the legend in the upper right corner.
    let x_area = 16 + 15 * label_lines as u32;
    let plot_height = f64::from(height.saturating_sub(x_area + 44).max(40));
    let legend = if chart.legend && chart.color_by == ColorBy::Series {
        18.0 * chart.series.len() as f64 + 14.0
    } else {
        0.0
    };
    let (lo, hi) = y_range(chart, (legend + 20.0) / plot_height);
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(&chart.title, (FONT, 18))
        .margin(8)
        .margin_right(16)
        .x_label_area_size(x_area)
        .y_label_area_size(62);
    let x = 0.0..groups as f64;
    match chart.scale {
        Scale::Linear => {
            let ctx = builder.build_cartesian_2d(x, lo..hi).map_err(draw_err)?;
            draw_body(ctx, chart, lo, label_chars)
        }
        Scale::Log => {
            let ctx = builder
                .build_cartesian_2d(x, (lo..hi).log_scale())
                .map_err(draw_err)?;
            draw_body(ctx, chart, lo, label_chars)
        }
    }
}

/// Draws the mesh, bars, labels and legend once the coordinates are built.
fn draw_body<'a, DB, Y>(
    mut ctx: ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>,
    chart: &Chart,
    base: f64,
    label_chars: usize,
) -> DrawResult
where
    DB: DrawingBackend + 'a,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let y_label = |v: &f64| compact(*v);
    ctx.configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_labels(6)
        .y_label_formatter(&y_label)
        .y_desc(chart.y_desc.as_str())
        .axis_desc_style((FONT, 15))
        .label_style((FONT, LABEL_SIZE))
        .light_line_style(WHITE)
        .bold_line_style(RGBColor(225, 225, 225))
        .draw()
        .map_err(draw_err)?;

    let series = chart.series.len().max(1);
    let slot = 0.8 / series as f64;
    let text = |size: u32, pos: Pos| TextStyle::from((FONT, size).into_font()).pos(pos);
    let above = text(13, Pos::new(HPos::Center, VPos::Bottom));
    let grey = text(12, Pos::new(HPos::Center, VPos::Bottom)).color(&RGBColor(120, 120, 120));
    let under = text(LABEL_SIZE, Pos::new(HPos::Center, VPos::Top));

    for s in 0..series {
        let mut bars = Vec::new();
        let mut marks = Vec::new();
        for (g, row) in chart.values.iter().enumerate() {
            let x0 = g as f64 + 0.1 + slot * s as f64;
            let (x1, mid) = (x0 + slot * 0.92, x0 + slot * 0.46);
            let colour = match chart.color_by {
                ColorBy::Series => color(s),
                ColorBy::Group => color(g),
            };
            match row.get(s).cloned().flatten() {
                Some(bar) => {
                    let top = bar.value.max(base);
                    bars.push(Rectangle::new([(x0, base), (x1, top)], colour.filled()));
                    let mut label_at = top;
                    if let Some((low, high)) = bar.range {
                        let (low, high) = (low.max(base), high.max(base));
                        label_at = label_at.max(high);
                        marks.push(PathElement::new(vec![(mid, low), (mid, high)], BLACK));
                        for end in [low, high] {
                            let cap = slot * 0.15;
                            marks.push(PathElement::new(
                                vec![(mid - cap, end), (mid + cap, end)],
                                BLACK,
                            ));
                        }
                    }
                    let label = format!("{}{}", compact(bar.value), bar.mark);
                    ctx.draw_series([EmptyElement::at((mid, label_at))
                        + Text::new(label, (0, -2), above.clone())])
                        .map_err(draw_err)?;
                }
                None => {
                    ctx.draw_series([
                        EmptyElement::at((mid, base)) + Text::new("n/m", (0, -2), grey.clone())
                    ])
                    .map_err(draw_err)?;
                }
            }
        }
        let drawn = ctx.draw_series(bars).map_err(draw_err)?;
        if chart.legend && chart.color_by == ColorBy::Series {
            let colour = color(s);
            drawn
                .label(chart.series.get(s).cloned().unwrap_or_default())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled())
                });
        }
        ctx.draw_series(marks).map_err(draw_err)?;
    }

    for (g, name) in chart.groups.iter().enumerate() {
        let centre = g as f64 + 0.5;
        for (i, line) in wrap(name, label_chars).into_iter().enumerate() {
            let dy = 6 + 15 * i as i32;
            ctx.draw_series([
                EmptyElement::at((centre, base)) + Text::new(line, (0, dy), under.clone())
            ])
            .map_err(draw_err)?;
        }
    }

    if chart.legend && chart.color_by == ColorBy::Series {
        ctx.configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font((FONT, LABEL_SIZE))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(180, 180, 180))
            .draw()
            .map_err(draw_err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_labels() {
        let cases = [
            (186_000.0, "186k"),
            (8_500.0, "8,500"),
            (9_998.0, "9,998"),
            (1_000.4, "1,000"),
            (10_000.0, "10k"),
            (10_800.0, "10.8k"),
            (1_500_000.0, "1.5M"),
            (748.8, "749"),
            (42.1, "42.1"),
            (9.77, "9.77"),
            (2.5, "2.5"),
            (0.25, "0.25"),
            (0.0, "0"),
        ];
        for (v, want) in cases {
            assert_eq!(compact(v), want, "{v}");
        }
    }

    #[test]
    fn wrap_keeps_words_whole() {
        assert_eq!(
            wrap("Pulsar 4.0.8: after 4 → 8 growth", 14),
            ["Pulsar 4.0.8:", "after 4 → 8", "growth"]
        );
        assert_eq!(
            wrap("averyveryverylongword x", 4),
            ["averyveryverylongword", "x"]
        );
    }

    #[test]
    fn the_log_range_starts_at_a_decade_and_leaves_room_on_top() {
        let chart = Chart {
            title: String::new(),
            y_desc: String::new(),
            groups: vec!["a".into()],
            series: vec!["s".into(), "t".into()],
            values: vec![vec![Some(Bar::new(9.8)), Some(Bar::new(10_000.0))]],
            scale: Scale::Log,
            color_by: ColorBy::Series,
            legend: true,
            label_lines: 1,
        };
        assert_eq!(y_range(&chart, 0.0), (1.0, 10_000.0));
        let (lo, hi) = y_range(&chart, 0.2);
        assert_eq!(lo, 1.0);
        assert!((hi.log10() - 5.0).abs() < 1e-9, "{hi}");
    }
}
