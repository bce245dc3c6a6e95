//! Tables (faults by process, ffaults by file, ...) as recorded: what the
//! live tool printed, replayed by `report` through the same printer.

use serde::{Deserialize, Serialize};

use crate::output::{Col, Row, Value};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Column {
    pub key: String,
    pub header: String,
    pub width: usize,
    pub left: bool,
}

/// A cell: `output::Value` in the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Cell {
    U(u64),
    I(i64),
    F(f64, usize),
    S(String),
    Null,
    B(bool),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Table {
    pub seq: u64,
    /// Seconds since the start of the run.
    pub at: f64,
    pub kind: String,
    pub title: String,
    #[serde(deserialize_with = "super::budget::list")]
    pub cols: Vec<Column>,
    #[serde(deserialize_with = "super::budget::lists")]
    pub rows: Vec<Vec<Cell>>,
}

impl Table {
    pub fn new(seq: u64, at: f64, kind: &str, title: &str, cols: &[Col], rows: &[Row]) -> Table {
        Table {
            seq,
            at,
            kind: kind.into(),
            title: title.into(),
            cols: cols
                .iter()
                .map(|c| Column {
                    key: c.key.into(),
                    header: c.header.into(),
                    width: c.width,
                    left: c.left,
                })
                .collect(),
            rows: rows
                .iter()
                .map(|r| r.0.iter().map(Cell::from).collect())
                .collect(),
        }
    }

    /// Columns and rows for a printer. Printers take static names, as
    /// tools give them: leaked, once per table of a one-shot command.
    pub fn for_printer(&self) -> (&'static str, Vec<Col>, Vec<Row>) {
        let leak = |s: &str| -> &'static str { Box::leak(s.to_string().into_boxed_str()) };
        let cols = self
            .cols
            .iter()
            .map(|c| Col {
                key: leak(&c.key),
                header: leak(&c.header),
                width: c.width,
                left: c.left,
            })
            .collect();
        let rows = self
            .rows
            .iter()
            .map(|r| Row(r.iter().map(Value::from).collect()))
            .collect();
        (leak(&self.kind), cols, rows)
    }
}

impl From<&Value> for Cell {
    fn from(v: &Value) -> Cell {
        match v {
            Value::U(n) => Cell::U(*n),
            Value::I(n) => Cell::I(*n),
            Value::F(f, p) => Cell::F(*f, *p),
            Value::S(s) => Cell::S(s.clone()),
            Value::B(b) => Cell::B(*b),
            Value::Null => Cell::Null,
        }
    }
}

impl From<&Cell> for Value {
    fn from(c: &Cell) -> Value {
        match c {
            Cell::U(n) => Value::U(*n),
            Cell::I(n) => Value::I(*n),
            Cell::F(f, p) => Value::F(*f, *p),
            Cell::S(s) => Value::S(s.clone()),
            Cell::B(b) => Value::B(*b),
            Cell::Null => Value::Null,
        }
    }
}
