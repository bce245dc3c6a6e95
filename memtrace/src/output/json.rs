use std::io::Write;

use serde_json::{json, Map, Value as J};

use super::sink::{putln, Sink};
use super::{Col, Hist, Printer, Rest, Row, Shown, StackReport, Summary, Value};

/// JSON Lines: one object per event, table row, stack or histogram, then one
/// summary object.
pub struct JsonPrinter {
    out: Sink,
}

impl JsonPrinter {
    pub fn new(out: Box<dyn Write>) -> Self {
        JsonPrinter {
            out: Sink::new(out),
        }
    }

    fn emit(&mut self, v: J) {
        putln!(self.out, "{v}");
    }
}

fn to_json(v: &Value) -> J {
    match v {
        Value::U(n) => json!(n),
        Value::I(n) => json!(n),
        Value::F(f, _) => json!(f),
        Value::S(s) => json!(s),
        Value::B(b) => json!(b),
        Value::Null => J::Null,
    }
}

fn object(kind: &str, cols: &[Col], row: &Row) -> J {
    let mut m = Map::new();
    m.insert("type".into(), json!(kind));
    m.insert("ts".into(), json!(unix_time()));
    for (c, v) in cols.iter().zip(&row.0) {
        m.insert(c.key.into(), to_json(v));
    }
    J::Object(m)
}

fn unix_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| (d.as_millis() as f64) / 1000.0)
        .unwrap_or(0.0)
}

impl Printer for JsonPrinter {
    fn event(&mut self, kind: &'static str, cols: &[Col], row: &Row) {
        // No flush per event: the session flushes after each batch it drains.
        let v = object(kind, cols, row);
        self.emit(v);
    }

    fn event_stack(&mut self, kind: &'static str, cols: &[Col], row: &Row, stack: &[Shown]) {
        let mut v = object(kind, cols, row);
        v["user_stack"] = json!(stack);
        self.emit(v);
        self.out.flush();
    }

    fn table(&mut self, kind: &'static str, _title: &str, cols: &[Col], rows: &[Row]) {
        for r in rows {
            let v = object(kind, cols, r);
            self.emit(v);
        }
        self.out.flush();
    }

    fn stacks(&mut self, kind: &'static str, title: &str, stacks: &[StackReport]) {
        for s in stacks {
            let mut v = json!({
                "type": kind,
                "pid": s.pid,
                "comm": s.comm,
                "count": s.count,
                "bytes": s.bytes,
                "user_stack": s.user,
                "kernel_stack": s.kernel,
                "note": s.note,
                "processes": s.processes.max(1),
            });
            if let Some(id) = crate::output::frame::fingerprint_text(&s.kernel, &s.user) {
                v["stack_id"] = json!(id);
            }
            if let Some(a) = &s.alloc {
                v["allocs"] = json!(a.allocs);
                v["bytes_allocated"] = json!(a.bytes);
                v["frees"] = json!(a.frees);
                v["bytes_freed"] = json!(a.freed_bytes);
                v["estimated"] = json!(a.estimated);
            }
            // What the stacks are of, where the tool says (count: the tracepoint).
            if !title.is_empty() {
                v["title"] = json!(title);
            }
            self.emit(v);
        }
        self.out.flush();
    }

    fn rest(&mut self, kind: &'static str, r: &Rest) {
        self.emit(json!({
            "type": "rest",
            "of": kind,
            "what": r.what,
            "items": r.items,
            "count": r.count,
            "bytes": r.bytes,
        }));
        self.out.flush();
    }

    fn histogram(&mut self, h: &Hist) {
        let buckets: Vec<J> = h
            .buckets
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| {
                let (lo, hi) = Hist::range(i);
                json!({"min": lo, "max": hi, "count": n})
            })
            .collect();
        self.emit(
            json!({"type": "histogram", "title": h.title, "unit": h.unit, "buckets": buckets}),
        );
    }

    fn summary(&mut self, s: &Summary) {
        let lost: Map<String, J> = s
            .lost
            .iter()
            .map(|(k, n)| ((*k).into(), json!(n)))
            .collect();
        let attached: Vec<J> = s
            .attached
            .iter()
            .map(|(p, m, t)| json!({"probe": p, "method": m, "target": t}))
            .collect();
        let mut m = Map::new();
        m.insert("type".into(), json!("summary"));
        m.insert("tool".into(), json!(s.tool));
        m.insert("duration_s".into(), json!(s.duration_s));
        m.insert("events".into(), json!(s.events));
        m.insert("lost_total".into(), json!(s.total_lost()));
        m.insert("lost".into(), J::Object(lost));
        let degraded: Map<String, J> = s
            .degraded
            .iter()
            .map(|(k, n)| ((*k).into(), json!(n)))
            .collect();
        m.insert("degraded".into(), J::Object(degraded));
        for (k, n) in &s.apart {
            m.insert((*k).into(), json!(n));
        }
        m.insert("attached".into(), J::Array(attached));
        if let Some(st) = s.command_status {
            m.insert("command_status".into(), json!(st));
        }
        for (k, v) in &s.extra {
            m.insert((*k).into(), to_json(v));
        }
        self.emit(J::Object(m));
        self.out.flush();
    }

    fn flush(&mut self) {
        self.out.flush();
    }

    fn error(&self) -> Option<&std::io::Error> {
        self.out.error()
    }
}
