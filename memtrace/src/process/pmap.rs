//! pmap-like views of a process's mappings, for reports taken at a
//! crossing (rss's threshold), while the process is still there.

use crate::output::{Col, Printer, Row};

/// The `n` largest mappings of `pid` by RSS, as a table of `kind`.
pub fn largest_mappings(out: &mut dyn Printer, kind: &'static str, pid: u32, n: usize) {
    let mut maps = crate::process::proc::smaps(pid);
    maps.sort_by_key(|m| std::cmp::Reverse(m.rss));
    let mcols = [
        Col::text("start", "ADDRESS", 12),
        Col::num("size_kb", "KBYTES", 9),
        Col::num("rss_kb", "RSS", 9),
        Col::num("pss_kb", "PSS", 9),
        Col::text("perms", "MODE", 4),
        Col::text("mapping", "MAPPING", 10),
    ];
    let rows: Vec<Row> = maps
        .iter()
        .take(n)
        .map(|m| {
            Row(vec![
                format!("{:012x}", m.start).into(),
                ((m.end - m.start) / 1024).into(),
                (m.rss / 1024).into(),
                (m.pss / 1024).into(),
                m.perms.clone().into(),
                if m.name.is_empty() {
                    "[anon]".to_string()
                } else {
                    m.name.clone()
                }
                .into(),
            ])
        })
        .collect();
    out.table(kind, "Largest mappings by RSS:", &mcols, &rows);
}
