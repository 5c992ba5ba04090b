//! The benchmark data files as tables: a header line, then one record per line, read by the
//! `csv` crate.
//!
//! Fields are separated by commas; a field may be quoted with `"` (then it may hold commas and
//! line breaks, and `""` stands for one quote). Blank lines are skipped and a leading
//! byte-order mark or `\r\n` line ends are accepted. A header without a name, a repeated
//! column or a record with another number of fields than the header is an error that names the
//! file and the line; nothing here panics on bad input.

use std::fmt;
use std::path::Path;

/// A problem in a CSV file, at a line (1-based; 0 when the file could not be read at all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CsvError {
    /// The file as it was named to the reader.
    pub(crate) file: String,
    /// The 1-based line of the problem, 0 for the whole file.
    pub(crate) line: usize,
    /// What is wrong.
    pub(crate) message: String,
}

impl fmt::Display for CsvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}:{}: {}", self.file, self.line, self.message)
        }
    }
}

impl std::error::Error for CsvError {}

/// One record: its fields and the line it came from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    /// The 1-based line of the record in its file.
    pub(crate) line: usize,
    /// The fields, unquoted, as many as the header has.
    pub(crate) fields: Vec<String>,
}

/// A parsed CSV file: the header's column names and the records.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Table {
    /// The file's name, for error messages.
    pub(crate) file: String,
    /// The column names of the header line.
    pub(crate) header: Vec<String>,
    /// The records, in file order.
    pub(crate) rows: Vec<Row>,
}

impl Table {
    /// Reads and parses the file at `path`.
    pub(crate) fn read(path: &Path) -> Result<Table, CsvError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| CsvError {
            file: file.clone(),
            line: 0,
            message: format!("cannot read: {e}"),
        })?;
        Table::parse(&file, &text)
    }

    /// Parses `text`, naming it `file` in errors.
    pub(crate) fn parse(file: &str, text: &str) -> Result<Table, CsvError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let error = |line: usize, message: String| CsvError {
            file: file.to_owned(),
            line,
            message,
        };
        // The header is read as a record of its own (its line and its checks are ours), and
        // records of any length are let through so that a wrong one is reported here with
        // its line.
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .from_reader(text.as_bytes());
        let mut header: Option<Vec<String>> = None;
        let mut rows = Vec::new();
        for record in reader.records() {
            let record = record.map_err(|e| {
                let line = e.position().map_or(0, |p| line_at(text, p.byte()));
                error(line, e.to_string())
            })?;
            let line = record.position().map_or(0, |p| line_at(text, p.byte()));
            // A line of spaces is a record of one blank field: skipped like an empty line.
            if record.len() == 1 && record[0].trim().is_empty() {
                continue;
            }
            let fields: Vec<String> = record.iter().map(str::to_owned).collect();
            match &header {
                None => {
                    if let Some(pos) = fields.iter().position(|f| f.trim().is_empty()) {
                        return Err(error(
                            line,
                            format!("header column {} has no name", pos + 1),
                        ));
                    }
                    for (i, name) in fields.iter().enumerate() {
                        if fields[..i].contains(name) {
                            return Err(error(line, format!("header names column `{name}` twice")));
                        }
                    }
                    header = Some(fields);
                }
                Some(names) => {
                    if fields.len() != names.len() {
                        return Err(error(
                            line,
                            format!(
                                "{} fields, but the header has {} columns",
                                fields.len(),
                                names.len()
                            ),
                        ));
                    }
                    rows.push(Row { line, fields });
                }
            }
        }
        let header = header.ok_or_else(|| error(0, "no header line".to_owned()))?;
        Ok(Table {
            file: file.to_owned(),
            header,
            rows,
        })
    }

    /// The index of the column `name`, or an error naming the file's header line.
    pub(crate) fn column(&self, name: &str) -> Result<usize, CsvError> {
        self.header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| CsvError {
                file: self.file.clone(),
                line: self.header_line(),
                message: format!(
                    "no column `{name}` (the header has: {})",
                    self.header.join(", ")
                ),
            })
    }

    /// The text of `row`'s field in column `col`, trimmed.
    pub(crate) fn text<'a>(&self, row: &'a Row, col: usize) -> &'a str {
        row.fields.get(col).map_or("", |f| f.trim())
    }

    /// The text of `row`'s field in column `col`, which must not be empty.
    pub(crate) fn required_text<'a>(&self, row: &'a Row, col: usize) -> Result<&'a str, CsvError> {
        let text = self.text(row, col);
        if text.is_empty() {
            return Err(self.field_error(row, col, "is empty".to_owned()));
        }
        Ok(text)
    }

    /// `row`'s field in column `col` as a finite number; `None` when it is empty (not
    /// measured).
    pub(crate) fn number(&self, row: &Row, col: usize) -> Result<Option<f64>, CsvError> {
        let text = self.text(row, col);
        if text.is_empty() {
            return Ok(None);
        }
        match text.parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(Some(v)),
            _ => Err(self.field_error(row, col, format!("`{text}` is not a number"))),
        }
    }

    /// `row`'s field in column `col` as a number that must be there.
    pub(crate) fn required_number(&self, row: &Row, col: usize) -> Result<f64, CsvError> {
        self.number(row, col)?
            .ok_or_else(|| self.field_error(row, col, "is empty".to_owned()))
    }

    /// An error about `row`'s field in column `col`.
    pub(crate) fn field_error(&self, row: &Row, col: usize, what: String) -> CsvError {
        let name = self.header.get(col).map_or("?", String::as_str);
        CsvError {
            file: self.file.clone(),
            line: row.line,
            message: format!("column `{name}` {what}"),
        }
    }

    /// An error about a whole record.
    pub(crate) fn row_error(&self, row: &Row, message: String) -> CsvError {
        CsvError {
            file: self.file.clone(),
            line: row.line,
            message,
        }
    }

    /// The line of the header: the line before the first record, or 1.
    fn header_line(&self) -> usize {
        // Blank lines may come first; the header is then later than line 1. Without records
        // its line is not kept, and 1 is the best guess.
        self.rows
            .first()
            .map_or(1, |r| r.line.saturating_sub(1).max(1))
    }
}

/// The 1-based line of the record whose reading started at `byte`: the reader's position is
/// where the record before it ended, so the line breaks and blank lines from there are skipped.
fn line_at(text: &str, byte: u64) -> usize {
    let bytes = text.as_bytes();
    let from = usize::try_from(byte).map_or(bytes.len(), |b| b.min(bytes.len()));
    let start = from
        + bytes[from..]
            .iter()
            .take_while(|b| matches!(b, b'\r' | b'\n'))
            .count();
    1 + bytes[..start].iter().filter(|&&b| b == b'\n').count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_quoted_fields_blank_lines_and_crlf() {
        let text = "\u{feff}a,b,c\r\n\r\n1,\"x, y\",\"say \"\"hi\"\"\"\r\n2,,\n";
        let table = Table::parse("t.csv", text).unwrap();
        assert_eq!(table.header, ["a", "b", "c"]);
        assert_eq!(table.rows.len(), 2);
        assert_eq!(table.rows[0].line, 3);
        assert_eq!(table.rows[0].fields, ["1", "x, y", "say \"hi\""]);
        assert_eq!(table.rows[1].fields, ["2", "", ""]);
        let b = table.column("b").unwrap();
        assert_eq!(table.number(&table.rows[1], b).unwrap(), None);
        assert_eq!(table.required_number(&table.rows[0], 0).unwrap(), 1.0);
    }

    #[test]
    fn a_quoted_field_may_span_lines_and_the_next_record_keeps_its_line() {
        let table = Table::parse("t.csv", "a,b\n\"x\ny\",1\n2,3\n").unwrap();
        assert_eq!(table.rows[0].fields, ["x\ny", "1"]);
        assert_eq!((table.rows[0].line, table.rows[1].line), (2, 4));
    }

    #[test]
    fn a_quoted_last_field_and_an_empty_quoted_field() {
        let table = Table::parse("t.csv", "a,b\n\"\",\"z\"\n").unwrap();
        assert_eq!(table.rows[0].fields, ["", "z"]);
    }

    #[test]
    fn errors_name_the_file_and_the_line() {
        let cases = [
            ("a,b\n1,2,3\n", 2, "3 fields, but the header has 2 columns"),
            (
                "a,b\n\n  \n1,2\n3\n",
                5,
                "1 fields, but the header has 2 columns",
            ),
            ("a,,c\n", 1, "has no name"),
            ("a,a\n", 1, "twice"),
            ("\n\n", 0, "no header line"),
        ];
        for (text, line, what) in cases {
            let err = Table::parse("data/x.csv", text).unwrap_err();
            assert_eq!(err.line, line, "{text:?}: {err}");
            assert!(err.message.contains(what), "{text:?}: {err}");
            assert!(err.to_string().starts_with("data/x.csv"), "{err}");
        }
    }

    #[test]
    fn a_bad_number_or_a_missing_column_is_an_error_at_its_line() {
        let table = Table::parse("x.csv", "name,value\nok,1.5\nbad,1.5k\ninf,inf\n").unwrap();
        let value = table.column("value").unwrap();
        assert_eq!(table.number(&table.rows[0], value).unwrap(), Some(1.5));
        let err = table.number(&table.rows[1], value).unwrap_err();
        assert_eq!(
            err.to_string(),
            "x.csv:3: column `value` `1.5k` is not a number"
        );
        assert!(table.number(&table.rows[2], value).is_err());
        let err = table.column("missing").unwrap_err();
        assert_eq!(err.line, 1);
        assert!(err.message.contains("name, value"), "{err}");
    }

    #[test]
    fn an_unreadable_file_is_an_error_naming_it() {
        let err = Table::read(Path::new("/nonexistent/bench.csv")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("/nonexistent/bench.csv: cannot read"),
            "{err}"
        );
    }
}
