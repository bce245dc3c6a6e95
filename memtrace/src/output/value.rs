//! What a table cell, an event field or a summary entry holds, and the
//! columns they are printed under.

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U(u64),
    I(i64),
    /// A float and the digits to print after the point.
    F(f64, usize),
    S(String),
    /// Yes or no: `true`/`false` in JSON.
    B(bool),
    Null,
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::U(v)
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::U(v as u64)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::I(v)
    }
}
impl From<i32> for Value {
    fn from(v: i32) -> Self {
        Value::I(v as i64)
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::S(v)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::B(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::S(v.to_string())
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map(Into::into).unwrap_or(Value::Null)
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::U(v) => write!(f, "{v}"),
            Value::I(v) => write!(f, "{v}"),
            Value::F(v, p) => write!(f, "{v:.p$}"),
            Value::S(s) => f.write_str(s),
            Value::B(b) => f.write_str(if *b { "yes" } else { "no" }),
            Value::Null => f.write_str("-"),
        }
    }
}

/// A column of a table or event line: the JSON key and the text header.
#[derive(Debug, Clone, Copy)]
pub struct Col {
    pub key: &'static str,
    pub header: &'static str,
    pub width: usize,
    /// Left-aligned (text) rather than right-aligned (numbers).
    pub left: bool,
}

impl Col {
    pub const fn num(key: &'static str, header: &'static str, width: usize) -> Col {
        Col {
            key,
            header,
            width,
            left: false,
        }
    }
    pub const fn text(key: &'static str, header: &'static str, width: usize) -> Col {
        Col {
            key,
            header,
            width,
            left: true,
        }
    }
}

/// Values in the order of the columns they belong to.
#[derive(Debug, Clone, Default)]
pub struct Row(pub Vec<Value>);
