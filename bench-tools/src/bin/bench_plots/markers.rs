//! The generated part of BENCHMARKS.md: whatever stands between two marker lines is replaced,
//! the rest of the file is kept byte for byte.

/// The line that opens the generated end-to-end table.
pub(crate) const START: &str = "<!-- bench-e2e: results start -->";
/// The line that closes it.
pub(crate) const END: &str = "<!-- bench-e2e: results end -->";

/// `text` with the lines between [`START`] and [`END`] replaced by `body` (framed by one
/// blank line each side). Replacing again with the same body changes nothing. Errors when a
/// marker is missing, doubled or out of order.
pub(crate) fn replace(text: &str, body: &str) -> Result<String, String> {
    let find = |marker: &str| {
        let mut at = text.match_indices(marker).map(|(i, _)| i).filter(|&i| {
            (i == 0 || text[..i].ends_with('\n')) && line_ends_after(text, i + marker.len())
        });
        match (at.next(), at.next()) {
            (Some(i), None) => Ok(i),
            (None, _) => Err(format!("no line `{marker}`")),
            (Some(_), Some(_)) => Err(format!("the line `{marker}` is there twice")),
        }
    };
    let start = find(START)?;
    let end = find(END)?;
    if end < start {
        return Err(format!("`{END}` comes before `{START}`"));
    }
    let body = body.trim_matches('\n');
    let mut out = String::with_capacity(text.len() + body.len());
    out.push_str(&text[..start + START.len()]);
    out.push_str("\n\n");
    out.push_str(body);
    out.push_str("\n\n");
    out.push_str(&text[end..]);
    Ok(out)
}

/// Whether the text at `i` is the end of a line (a line end or the end of the text).
fn line_ends_after(text: &str, i: usize) -> bool {
    let rest = &text[i..];
    rest.is_empty() || rest.starts_with('\n') || rest.starts_with("\r\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_between_the_markers_and_is_idempotent() {
        let text = format!("# Title\n\nintro\n{START}\nold table\n\n{END}\n\nafter\n");
        let once = replace(&text, "| a |\n|---|\n| 1 |\n").unwrap();
        assert_eq!(
            once,
            format!("# Title\n\nintro\n{START}\n\n| a |\n|---|\n| 1 |\n\n{END}\n\nafter\n")
        );
        assert_eq!(replace(&once, "| a |\n|---|\n| 1 |\n").unwrap(), once);
        let other = replace(&once, "| b |").unwrap();
        assert!(other.contains("| b |") && !other.contains("| a |"));
        assert!(other.ends_with(&format!("{END}\n\nafter\n")));
    }

    #[test]
    fn markers_at_the_very_ends_of_the_file() {
        let text = format!("{START}\n{END}");
        assert_eq!(
            replace(&text, "x").unwrap(),
            format!("{START}\n\nx\n\n{END}")
        );
    }

    #[test]
    fn missing_doubled_or_swapped_markers_are_errors() {
        assert!(
            replace("nothing here\n", "x")
                .unwrap_err()
                .contains("no line")
        );
        let doubled = format!("{START}\n{START}\n{END}\n");
        assert!(replace(&doubled, "x").unwrap_err().contains("twice"));
        let swapped = format!("{END}\n{START}\n");
        assert!(replace(&swapped, "x").unwrap_err().contains("comes before"));
        // A marker quoted inside a line is not a marker line.
        let quoted = format!("see `{START}`\n{START}\n{END}\n");
        assert!(replace(&quoted, "x").is_ok());
    }
}
