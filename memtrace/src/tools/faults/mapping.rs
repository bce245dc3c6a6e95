//! `faults --by-mapping`: faults by the mapping of the page they hit
//! (heap, stack, anonymous regions, each file), per process.

use std::collections::HashMap;

use memtrace_common::faults::FaultKey;

use super::Faults;
use crate::error::Result;
use crate::output::{Col, Printer, Row, Value};
use crate::stacks::symbolize::Mapping;
use crate::stacks::Traced;

impl Faults {
    pub(super) fn by_mapping(
        &self,
        s: &mut Traced,
        out: &mut dyn Printer,
        data: &[(FaultKey, u64, String)],
        title: &str,
    ) -> Result<()> {
        let maps_cache = s.sym.maps.lock().unwrap();
        let mut agg: HashMap<(u32, String, u64, u64), u64> = HashMap::new();
        for (k, c, _) in data {
            let label = maps_cache
                .maps(k.tgid)
                .and_then(|maps| maps.iter().find(|m| m.start <= k.page && k.page < m.end))
                .map(|m| (label(m), m.start, m.end))
                .unwrap_or_else(|| ("[unmapped or unmapped since]".to_string(), 0, 0));
            *agg.entry((k.tgid, label.0, label.1, label.2)).or_default() += c;
        }
        drop(maps_cache);
        let mut v: Vec<_> = agg.into_iter().collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.1));
        let shown = crate::run::tool::shown(self.args.top, &self.args.common, self.args.folded);
        let rest = crate::output::cut(&mut v, shown, "mappings", |e| e.1);
        let cols = [
            Col::num("pid", "PID", 7),
            Col::num("faults", "FAULTS", 10),
            Col::text("start", "START", 14),
            Col::text("end", "END", 14),
            Col::text("mapping", "MAPPING", 10),
        ];
        let rows: Vec<Row> = v
            .into_iter()
            .map(|((pid, l, a, b), c)| {
                Row(vec![
                    pid.into(),
                    c.into(),
                    format!("{a:x}").into(),
                    format!("{b:x}").into(),
                    Value::S(l),
                ])
            })
            .collect();
        out.table("fault_mapping", title, &cols, &rows);
        if let Some(r) = rest {
            out.rest("fault_mapping", &r);
        }
        Ok(())
    }
}

/// "[heap]", "[stack]", a file path, or "[anon]" for anonymous regions.
pub fn label(m: &Mapping) -> String {
    if m.path.is_empty() {
        "[anon]".into()
    } else {
        m.path.to_string()
    }
}
