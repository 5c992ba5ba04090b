//! Subscription filters as the broker applies them to pops: tag expressions (`*`, `a`,
//! `a || b`) and a subset of SQL92 over the user properties and `TAGS`.
//!
//! The SQL92 subset: comparisons (`=`, `<>`, `!=`, `<`, `<=`, `>`, `>=`), `AND`, `OR`, `NOT`,
//! parentheses, `[NOT] IN (...)`, `[NOT] BETWEEN x AND y`, `IS [NOT] NULL`, string literals in
//! single quotes (`''` for a quote), numbers, `TRUE` and `FALSE`. As on the broker, a property
//! the message lacks makes a comparison unknown, and an unknown expression does not match;
//! numbers compare with property values that parse as numbers; strings only compare for
//! (in)equality. Anything else does not parse: the proxy answers such a receive with
//! `INTERNAL_SERVER_ERROR` "parse the consumer's subscription failed".

use std::collections::{BTreeSet, HashMap};

/// A parsed subscription filter.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Filter {
    /// Every message.
    All,
    /// Messages whose tag is one of these.
    Tags(BTreeSet<String>),
    /// Messages the expression is true for.
    Sql(Expr),
}

impl Filter {
    /// A tag expression (blank or `*` is every message).
    pub(crate) fn tags(expression: &str) -> Self {
        let tags: BTreeSet<String> = expression
            .split("||")
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect();
        if tags.is_empty() || tags.contains("*") {
            Filter::All
        } else {
            Filter::Tags(tags)
        }
    }

    /// A SQL92 expression, or why it does not parse.
    pub(crate) fn sql(expression: &str) -> Result<Self, String> {
        let tokens = tokenize(expression)?;
        let mut parser = Parser { tokens, at: 0 };
        let expr = parser.or()?;
        if parser.at != parser.tokens.len() {
            return Err(format!("unexpected {:?}", parser.tokens[parser.at]));
        }
        Ok(Filter::Sql(expr))
    }

    /// Whether a message with this tag and these user properties passes.
    pub(crate) fn matches(&self, tag: Option<&str>, properties: &HashMap<String, String>) -> bool {
        match self {
            Filter::All => true,
            Filter::Tags(tags) => tag.is_some_and(|t| tags.contains(t)),
            Filter::Sql(expr) => expr.eval(tag, properties) == Some(true),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Str(String),
    Num(f64),
    Op(&'static str),
    LParen,
    RParen,
    Comma,
}

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '(' => {
                out.push(Token::LParen);
                i += 1;
            }
            ')' => {
                out.push(Token::RParen);
                i += 1;
            }
            ',' => {
                out.push(Token::Comma);
                i += 1;
            }
            '\'' => {
                let mut s = String::new();
                i += 1;
                loop {
                    match chars.get(i) {
                        None => return Err("an unterminated string".into()),
                        Some('\'') if chars.get(i + 1) == Some(&'\'') => {
                            s.push('\'');
                            i += 2;
                        }
                        Some('\'') => {
                            i += 1;
                            break;
                        }
                        Some(c) => {
                            s.push(*c);
                            i += 1;
                        }
                    }
                }
                out.push(Token::Str(s));
            }
            '=' | '<' | '>' | '!' => {
                let next = chars.get(i + 1).copied();
                let (op, len) = match (c, next) {
                    ('<', Some('>')) => ("<>", 2),
                    ('!', Some('=')) => ("<>", 2),
                    ('<', Some('=')) => ("<=", 2),
                    ('>', Some('=')) => (">=", 2),
                    ('=', _) => ("=", 1),
                    ('<', _) => ("<", 1),
                    ('>', _) => (">", 1),
                    _ => return Err(format!("unexpected {c:?}")),
                };
                out.push(Token::Op(op));
                i += len;
            }
            c if c.is_ascii_digit()
                || (c == '-' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                let start = i;
                i += 1;
                while chars
                    .get(i)
                    .is_some_and(|c| c.is_ascii_digit() || *c == '.')
                {
                    i += 1;
                }
                let s: String = chars[start..i].iter().collect();
                out.push(Token::Num(
                    s.parse().map_err(|_| format!("a bad number {s:?}"))?,
                ));
            }
            c if c.is_alphabetic() || c == '_' => {
                let start = i;
                while chars
                    .get(i)
                    .is_some_and(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | '-'))
                {
                    i += 1;
                }
                out.push(Token::Ident(chars[start..i].iter().collect()));
            }
            other => return Err(format!("unexpected {other:?}")),
        }
    }
    Ok(out)
}

/// A SQL92 expression.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Expr {
    Or(Box<Expr>, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Bool(bool),
    Compare(Value, &'static str, Value),
    In(Value, Vec<Value>, bool),
    Between(Value, Value, Value, bool),
    IsNull(Value, bool),
}

/// An operand: a property (or `TAGS`) or a literal.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Property(String),
    Str(String),
    Num(f64),
}

#[derive(Debug, Clone, PartialEq)]
enum Resolved {
    Str(String),
    Num(f64),
}

impl Value {
    fn resolve(&self, tag: Option<&str>, properties: &HashMap<String, String>) -> Option<Resolved> {
        match self {
            Value::Property(name) if name == "TAGS" => tag.map(|t| Resolved::Str(t.to_owned())),
            Value::Property(name) => properties.get(name).map(|v| Resolved::Str(v.clone())),
            Value::Str(s) => Some(Resolved::Str(s.clone())),
            Value::Num(n) => Some(Resolved::Num(*n)),
        }
    }
}

fn compare(left: &Resolved, op: &str, right: &Resolved) -> Option<bool> {
    let number = |r: &Resolved| match r {
        Resolved::Num(n) => Some(*n),
        Resolved::Str(s) => s.trim().parse::<f64>().ok(),
    };
    match (left, right) {
        (Resolved::Str(a), Resolved::Str(b)) => match op {
            "=" => Some(a == b),
            "<>" => Some(a != b),
            _ => None,
        },
        _ => {
            let (a, b) = (number(left)?, number(right)?);
            Some(match op {
                "=" => a == b,
                "<>" => a != b,
                "<" => a < b,
                "<=" => a <= b,
                ">" => a > b,
                ">=" => a >= b,
                _ => return None,
            })
        }
    }
}

impl Expr {
    /// Three-valued: `None` is unknown (a missing property).
    fn eval(&self, tag: Option<&str>, properties: &HashMap<String, String>) -> Option<bool> {
        let value = |v: &Value| v.resolve(tag, properties);
        match self {
            Expr::Or(a, b) => match (a.eval(tag, properties), b.eval(tag, properties)) {
                (Some(true), _) | (_, Some(true)) => Some(true),
                (Some(false), Some(false)) => Some(false),
                _ => None,
            },
            Expr::And(a, b) => match (a.eval(tag, properties), b.eval(tag, properties)) {
                (Some(false), _) | (_, Some(false)) => Some(false),
                (Some(true), Some(true)) => Some(true),
                _ => None,
            },
            Expr::Not(a) => a.eval(tag, properties).map(|b| !b),
            Expr::Bool(b) => Some(*b),
            Expr::Compare(a, op, b) => compare(&value(a)?, op, &value(b)?),
            Expr::In(a, list, negated) => {
                let a = value(a)?;
                let found = list
                    .iter()
                    .filter_map(value)
                    .any(|b| compare(&a, "=", &b) == Some(true));
                Some(found != *negated)
            }
            Expr::Between(a, low, high, negated) => {
                let a = value(a)?;
                let inside = compare(&a, ">=", &value(low)?)? && compare(&a, "<=", &value(high)?)?;
                Some(inside != *negated)
            }
            Expr::IsNull(a, negated) => Some(value(a).is_none() != *negated),
        }
    }
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn keyword(&mut self, word: &str) -> bool {
        match self.peek() {
            Some(Token::Ident(w)) if w.eq_ignore_ascii_case(word) => {
                self.at += 1;
                true
            }
            _ => false,
        }
    }

    fn expect(&mut self, token: &Token) -> Result<(), String> {
        if self.peek() == Some(token) {
            self.at += 1;
            Ok(())
        } else {
            Err(format!("expected {token:?}, found {:?}", self.peek()))
        }
    }

    fn or(&mut self) -> Result<Expr, String> {
        let mut left = self.and()?;
        while self.keyword("OR") {
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, String> {
        let mut left = self.not()?;
        while self.keyword("AND") {
            left = Expr::And(Box::new(left), Box::new(self.not()?));
        }
        Ok(left)
    }

    fn not(&mut self) -> Result<Expr, String> {
        if self.keyword("NOT") {
            return Ok(Expr::Not(Box::new(self.not()?)));
        }
        self.predicate()
    }

    fn predicate(&mut self) -> Result<Expr, String> {
        if self.peek() == Some(&Token::LParen) {
            self.at += 1;
            let inner = self.or()?;
            self.expect(&Token::RParen)?;
            return Ok(inner);
        }
        if self.keyword("TRUE") {
            return Ok(Expr::Bool(true));
        }
        if self.keyword("FALSE") {
            return Ok(Expr::Bool(false));
        }
        let left = self.value()?;
        if let Some(Token::Op(op)) = self.peek() {
            let op = *op;
            self.at += 1;
            return Ok(Expr::Compare(left, op, self.value()?));
        }
        if self.keyword("IS") {
            let negated = self.keyword("NOT");
            if !self.keyword("NULL") {
                return Err("expected NULL after IS".into());
            }
            return Ok(Expr::IsNull(left, negated));
        }
        let negated = self.keyword("NOT");
        if self.keyword("IN") {
            self.expect(&Token::LParen)?;
            let mut list = vec![self.literal()?];
            while self.peek() == Some(&Token::Comma) {
                self.at += 1;
                list.push(self.literal()?);
            }
            self.expect(&Token::RParen)?;
            return Ok(Expr::In(left, list, negated));
        }
        if self.keyword("BETWEEN") {
            let low = self.literal()?;
            if !self.keyword("AND") {
                return Err("expected AND in BETWEEN".into());
            }
            let high = self.literal()?;
            return Ok(Expr::Between(left, low, high, negated));
        }
        Err(format!("expected a comparison, found {:?}", self.peek()))
    }

    fn literal(&mut self) -> Result<Value, String> {
        match self.value()? {
            Value::Property(name) => Err(format!("expected a literal, found {name}")),
            literal => Ok(literal),
        }
    }

    fn value(&mut self) -> Result<Value, String> {
        let token = self.peek().cloned();
        self.at += 1;
        match token {
            Some(Token::Ident(name))
                if !["AND", "OR", "NOT", "IN", "BETWEEN", "IS", "NULL"]
                    .iter()
                    .any(|k| name.eq_ignore_ascii_case(k)) =>
            {
                Ok(Value::Property(name))
            }
            Some(Token::Str(s)) => Ok(Value::Str(s)),
            Some(Token::Num(n)) => Ok(Value::Num(n)),
            other => Err(format!("expected a value, found {other:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn tag_expressions() {
        let none = HashMap::new();
        assert!(Filter::tags("*").matches(None, &none));
        assert!(Filter::tags("a || b").matches(Some("b"), &none));
        assert!(!Filter::tags("a || b").matches(Some("c"), &none));
        assert!(!Filter::tags("a").matches(None, &none));
    }

    #[test]
    fn sql92_subset() {
        let m = props(&[("n", "7"), ("color", "red")]);
        let yes = |e: &str| Filter::sql(e).unwrap().matches(Some("t1"), &m);
        assert!(yes("n > 5"));
        assert!(!yes("n < 5"));
        assert!(yes("color = 'red' AND n BETWEEN 6 AND 8"));
        assert!(yes("color IN ('blue', 'red')"));
        assert!(yes("NOT (color = 'blue')"));
        assert!(yes("missing IS NULL AND TAGS = 't1'"));
        assert!(!yes("missing IS NOT NULL"));
        assert!(!yes("missing = 'x'"));
        assert!(!yes("NOT (missing = 'x')"), "unknown stays unknown");
        assert!(yes("missing = 'x' OR n = 7"));
        assert!(yes("n NOT BETWEEN 1 AND 3"));
        for bad in ["a >>> 1", "n >", "color = 'red", "(n > 1", "n LIKE 'x'", ""] {
            assert!(Filter::sql(bad).is_err(), "{bad}");
        }
    }
}
