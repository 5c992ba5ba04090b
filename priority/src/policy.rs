//! The priority policy shared by producers and consumers: levels, their order, the default
//! level and the message property that carries a message's priority.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::Error;

/// The largest number of levels a policy may have.
pub const MAX_LEVELS: usize = 32;

/// The property name the published Pulsar recipe used (`sn_msg_prop_priority`).
pub const DEFAULT_PROPERTY: &str = "sn_msg_prop_priority";

/// A priority level. **Level 0 is always the most important** inside this crate; a larger
/// level is less important.
///
/// How levels appear in message properties is the policy's business ([`ValueOrder`]): a policy
/// whose larger property values are more important maps the largest value to level 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Level(u8);

impl Level {
    /// The most important level.
    pub const HIGHEST: Level = Level(0);

    /// The level with this index (0 = most important). Validate it against a policy with
    /// [`PriorityPolicy::level`] when it comes from outside.
    pub const fn new(index: u8) -> Level {
        Level(index)
    }

    /// The level's index (0 = most important).
    pub const fn get(self) -> u8 {
        self.0
    }

    /// The level's index as a `usize`, for indexing per-level tables.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "level {}", self.0)
    }
}

/// How a message property's number maps to a [`Level`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ValueOrder {
    /// Property value 0 is the most important (the published Pulsar recipe's convention and
    /// Pulsar's consumer `priorityLevel`): value `v` is level `v`.
    #[default]
    LowerIsMoreImportant,
    /// The largest property value is the most important (JMS, RabbitMQ): value `v` is level
    /// `levels - 1 - v`.
    HigherIsMoreImportant,
}

/// What parsing a message's priority property found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseOutcome {
    /// The property held a valid level.
    Valid,
    /// The message had no priority property (or an empty one): default level.
    Missing,
    /// The property was not a non-negative decimal number: default level.
    Invalid,
    /// The property was a number but not a level of this policy: default level.
    OutOfRange,
}

/// A parsed priority: the level to use and how it was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parsed {
    /// The level the message belongs to (the default level unless `outcome` is `Valid`).
    pub level: Level,
    /// How the level was found.
    pub outcome: ParseOutcome,
}

/// Counts of parsed properties by outcome, shared by every clone of a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ParseStats {
    /// Properties that held a valid level.
    pub valid: u64,
    /// Messages without the property (sent to the default level).
    pub missing: u64,
    /// Properties that were not a non-negative decimal number (sent to the default level).
    pub invalid: u64,
    /// Numbers that are not a level of the policy (sent to the default level).
    pub out_of_range: u64,
}

#[derive(Debug, Default)]
struct Counters {
    valid: AtomicU64,
    missing: AtomicU64,
    invalid: AtomicU64,
    out_of_range: AtomicU64,
}

/// The one priority definition a producer and a consumer share.
///
/// It says how many levels there are (level 0 most important), which level a message without
/// a usable priority gets, which message property carries the priority and how its value reads.
/// Clones share their [`ParseStats`] counters, so a policy handed to a router and a gate counts
/// in one place.
///
/// ```
/// use mq_priority::{Level, ParseOutcome, PriorityPolicy};
///
/// let policy = PriorityPolicy::builder().levels(3).default_level(2).build()?;
/// assert_eq!(policy.level_of(Some("0")), Level::new(0));
/// assert_eq!(policy.parse(Some("urgent")).outcome, ParseOutcome::Invalid);
/// assert_eq!(policy.level_of(None), Level::new(2));
/// assert_eq!(policy.stats().missing, 1);
/// # Ok::<(), mq_priority::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct PriorityPolicy {
    levels: u8,
    default_level: Level,
    order: ValueOrder,
    property: Arc<str>,
    counters: Arc<Counters>,
}

impl PriorityPolicy {
    /// A builder with 2 levels, the least important level as default, property
    /// [`DEFAULT_PROPERTY`] and [`ValueOrder::LowerIsMoreImportant`].
    #[must_use]
    pub fn builder() -> PolicyBuilder {
        PolicyBuilder::default()
    }

    /// A policy with `levels` levels and the defaults of [`PriorityPolicy::builder`].
    pub fn new(levels: usize) -> Result<PriorityPolicy, Error> {
        PriorityPolicy::builder().levels(levels).build()
    }

    /// The number of levels.
    pub fn levels(&self) -> usize {
        usize::from(self.levels)
    }

    /// Every level, most important first.
    pub fn all_levels(&self) -> impl Iterator<Item = Level> + use<> {
        (0..self.levels).map(Level)
    }

    /// The least important level.
    pub fn lowest(&self) -> Level {
        Level(self.levels - 1)
    }

    /// The level messages without a usable priority get.
    pub fn default_level(&self) -> Level {
        self.default_level
    }

    /// How property values map to levels.
    pub fn order(&self) -> ValueOrder {
        self.order
    }

    /// The name of the message property that carries the priority.
    pub fn property(&self) -> &str {
        &self.property
    }

    /// `index` as a level of this policy, or [`Error::LevelOutOfRange`].
    pub fn level(&self, index: u32) -> Result<Level, Error> {
        match u8::try_from(index) {
            Ok(i) if i < self.levels => Ok(Level(i)),
            _ => Err(Error::LevelOutOfRange {
                level: index,
                levels: self.levels(),
            }),
        }
    }

    /// Whether `level` is one of this policy's levels.
    pub fn contains(&self, level: Level) -> bool {
        level.0 < self.levels
    }

    /// `level` if it belongs to this policy, otherwise the default level (never panics).
    pub fn clamp(&self, level: Level) -> Level {
        if self.contains(level) {
            level
        } else {
            self.default_level
        }
    }

    /// The property value a producer writes for `level` (decimal, in this policy's order).
    /// A level outside the policy is written as the default level.
    pub fn property_value(&self, level: Level) -> String {
        let level = self.clamp(level);
        let value = match self.order {
            ValueOrder::LowerIsMoreImportant => level.0,
            ValueOrder::HigherIsMoreImportant => self.levels - 1 - level.0,
        };
        value.to_string()
    }

    /// Reads a property value without counting it. `None` or an empty string is
    /// [`ParseOutcome::Missing`]; anything but a non-negative decimal number (an optional `+`,
    /// ASCII digits, no spaces) is [`ParseOutcome::Invalid`]; a number that is not a level is
    /// [`ParseOutcome::OutOfRange`]. All three give the default level.
    pub fn classify(&self, value: Option<&str>) -> Parsed {
        let fallback = |outcome| Parsed {
            level: self.default_level,
            outcome,
        };
        let Some(value) = value.filter(|v| !v.is_empty()) else {
            return fallback(ParseOutcome::Missing);
        };
        let digits = value.strip_prefix('+').unwrap_or(value);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return fallback(ParseOutcome::Invalid);
        }
        // Only digits are left: a parse failure can only be an overflow, which is out of range.
        let Ok(number) = digits.parse::<u64>() else {
            return fallback(ParseOutcome::OutOfRange);
        };
        if number >= u64::from(self.levels) {
            return fallback(ParseOutcome::OutOfRange);
        }
        // number < levels <= MAX_LEVELS, so it fits in u8.
        let number = number as u8;
        let level = match self.order {
            ValueOrder::LowerIsMoreImportant => number,
            ValueOrder::HigherIsMoreImportant => self.levels - 1 - number,
        };
        Parsed {
            level: Level(level),
            outcome: ParseOutcome::Valid,
        }
    }

    /// Reads a property value like [`PriorityPolicy::classify`] and counts the outcome in
    /// [`PriorityPolicy::stats`].
    pub fn parse(&self, value: Option<&str>) -> Parsed {
        let parsed = self.classify(value);
        let counter = match parsed.outcome {
            ParseOutcome::Valid => &self.counters.valid,
            ParseOutcome::Missing => &self.counters.missing,
            ParseOutcome::Invalid => &self.counters.invalid,
            ParseOutcome::OutOfRange => &self.counters.out_of_range,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        parsed
    }

    /// The level of a message whose priority property is `value` (counted, see
    /// [`PriorityPolicy::parse`]).
    pub fn level_of(&self, value: Option<&str>) -> Level {
        self.parse(value).level
    }

    /// The level of a message given a lookup of its properties by name (counted).
    pub fn level_from<'a>(&self, lookup: impl FnOnce(&str) -> Option<&'a str>) -> Level {
        self.level_of(lookup(&self.property))
    }

    /// How many property values were parsed, by outcome (shared by all clones).
    pub fn stats(&self) -> ParseStats {
        ParseStats {
            valid: self.counters.valid.load(Ordering::Relaxed),
            missing: self.counters.missing.load(Ordering::Relaxed),
            invalid: self.counters.invalid.load(Ordering::Relaxed),
            out_of_range: self.counters.out_of_range.load(Ordering::Relaxed),
        }
    }
}

/// Builds a [`PriorityPolicy`]; [`PolicyBuilder::build`] validates it.
#[derive(Debug, Clone)]
pub struct PolicyBuilder {
    levels: usize,
    default_level: Option<u32>,
    order: ValueOrder,
    property: String,
}

impl Default for PolicyBuilder {
    fn default() -> Self {
        PolicyBuilder {
            levels: 2,
            default_level: None,
            order: ValueOrder::default(),
            property: DEFAULT_PROPERTY.to_owned(),
        }
    }
}

impl PolicyBuilder {
    /// The number of levels, 1 to [`MAX_LEVELS`] (default 2).
    #[must_use]
    pub fn levels(mut self, levels: usize) -> Self {
        self.levels = levels;
        self
    }

    /// The level (0 = most important) of messages without a usable priority (default: the
    /// least important level).
    #[must_use]
    pub fn default_level(mut self, level: u32) -> Self {
        self.default_level = Some(level);
        self
    }

    /// How property values map to levels (default [`ValueOrder::LowerIsMoreImportant`]).
    #[must_use]
    pub fn order(mut self, order: ValueOrder) -> Self {
        self.order = order;
        self
    }

    /// The message property carrying the priority (default [`DEFAULT_PROPERTY`]).
    #[must_use]
    pub fn property(mut self, name: impl Into<String>) -> Self {
        self.property = name.into();
        self
    }

    /// Validates and builds the policy.
    pub fn build(self) -> Result<PriorityPolicy, Error> {
        let levels = match u8::try_from(self.levels) {
            Ok(l) if l >= 1 && self.levels <= MAX_LEVELS => l,
            _ => {
                return Err(Error::InvalidLevelCount {
                    levels: self.levels,
                    max: MAX_LEVELS,
                });
            }
        };
        let default_level = match self.default_level {
            None => Level(levels - 1),
            Some(d) => match u8::try_from(d) {
                Ok(d) if d < levels => Level(d),
                _ => {
                    return Err(Error::LevelOutOfRange {
                        level: d,
                        levels: self.levels,
                    });
                }
            },
        };
        if self.property.trim().is_empty() {
            return Err(Error::EmptyPropertyName);
        }
        Ok(PriorityPolicy {
            levels,
            default_level,
            order: self.order,
            property: Arc::from(self.property),
            counters: Arc::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_two_levels_lowest_default_recipe_property() {
        let p = PriorityPolicy::builder().build().unwrap();
        assert_eq!(p.levels(), 2);
        assert_eq!(p.default_level(), Level::new(1));
        assert_eq!(p.property(), "sn_msg_prop_priority");
    }

    #[test]
    fn validation_rejects_bad_settings_with_clear_errors() {
        assert!(matches!(
            PriorityPolicy::new(0),
            Err(Error::InvalidLevelCount { levels: 0, .. })
        ));
        assert!(matches!(
            PriorityPolicy::new(MAX_LEVELS + 1),
            Err(Error::InvalidLevelCount { .. })
        ));
        assert!(matches!(
            PriorityPolicy::new(300),
            Err(Error::InvalidLevelCount { .. })
        ));
        let e = PriorityPolicy::builder()
            .levels(3)
            .default_level(3)
            .build()
            .unwrap_err();
        assert_eq!(
            e,
            Error::LevelOutOfRange {
                level: 3,
                levels: 3
            }
        );
        assert!(e.to_string().contains("levels 0..3"));
        assert_eq!(
            PriorityPolicy::builder().property(" ").build().unwrap_err(),
            Error::EmptyPropertyName
        );
    }

    #[test]
    fn missing_invalid_and_out_of_range_values_go_to_the_default_and_are_counted() {
        let p = PriorityPolicy::builder()
            .levels(3)
            .default_level(1)
            .build()
            .unwrap();
        let q = p.clone();
        assert_eq!(p.parse(Some("2")).outcome, ParseOutcome::Valid);
        assert_eq!(p.parse(Some("+0")).level, Level::new(0));
        for v in [None, Some("")] {
            assert_eq!(p.parse(v).outcome, ParseOutcome::Missing);
        }
        // The recipe's consumer read "-1" as lowest while its router used Integer.valueOf:
        // here both sides read it the same way (default level).
        for v in ["-1", " 1", "1.0", "x", "+"] {
            let parsed = p.parse(Some(v));
            assert_eq!(parsed.outcome, ParseOutcome::Invalid, "{v}");
            assert_eq!(parsed.level, Level::new(1));
        }
        for v in ["3", "255", "99999999999999999999999"] {
            assert_eq!(p.parse(Some(v)).outcome, ParseOutcome::OutOfRange, "{v}");
        }
        assert_eq!(
            q.stats(),
            ParseStats {
                valid: 2,
                missing: 2,
                invalid: 5,
                out_of_range: 3
            }
        );
    }

    #[test]
    fn higher_is_more_important_maps_values_both_ways() {
        let p = PriorityPolicy::builder()
            .levels(4)
            .order(ValueOrder::HigherIsMoreImportant)
            .build()
            .unwrap();
        assert_eq!(p.classify(Some("3")).level, Level::HIGHEST);
        assert_eq!(p.classify(Some("0")).level, Level::new(3));
        for level in p.all_levels() {
            let v = p.property_value(level);
            assert_eq!(p.classify(Some(&v)).level, level);
        }
    }

    #[test]
    fn level_lookup_and_clamp_never_panic() {
        let p = PriorityPolicy::new(2).unwrap();
        assert!(p.level(2).is_err());
        assert!(p.level(u32::MAX).is_err());
        assert_eq!(p.clamp(Level::new(200)), p.default_level());
        assert_eq!(p.property_value(Level::new(200)), "1");
        let props = [("sn_msg_prop_priority", "0")];
        let level = p.level_from(|name| props.iter().find(|(k, _)| *k == name).map(|(_, v)| *v));
        assert_eq!(level, Level::HIGHEST);
    }
}
