//! `report` and `diff` in the guest, on the records of `record-a` (`rawbrk
//! 40 4096`) and `record-b` (`rawbrk-deep 60 3 5`), as tests/record.rs and
//! tests/record_compare.rs check them on the host.

use serde_json::Value;

use super::check::{json, of_type, Guest};

/// The stack whose innermost frames are `inner` then `outer`.
fn find<'a>(stacks: &[&'a Value], inner: &str, outer: &str) -> Option<&'a Value> {
    stacks.iter().copied().find(|s| {
        let f = |i: usize| s["user_stack"][i].as_str().unwrap_or("");
        f(0).contains(inner) && f(1).contains(outer)
    })
}

/// The record read back is what the live run printed: the loop's 40 calls
/// and the brk(0) before them on one stack.
pub(super) fn report(g: &Guest, v: &[Value], why: &mut Vec<String>) {
    let live = json(g.out.get("record-a").map_or(&[][..], |v| v));
    let (was, is) = (of_type(&live, "brk_stack"), of_type(v, "brk_stack"));
    if was != is {
        why.push(format!(
            "{} stacks read back, not the {} record-a printed",
            is.len(),
            was.len()
        ));
    }
    match find(&is, "grow_heap_with_raw_brk", "memtrace_workload::main") {
        Some(s) if s["count"] == 41 && s["bytes"] == 40 * 4096 => {}
        s => why.push(format!("the loop's stack: {s:?}, expected 41 calls")),
    }
}

/// From record-a to record-b the loop's stack grew by 20 calls, and one
/// appeared below raw_brk_deep (5 calls of a page and its brk(0)).
pub(super) fn diff(v: &[Value], why: &mut Vec<String>) {
    let rows = of_type(v, "diff");
    let mut expect = |outer: &str, fields: &[(&str, Value)]| {
        let Some(r) = find(&rows, "grow_heap_with_raw_brk", outer) else {
            why.push(format!("no diff row of grow_heap_with_raw_brk <- {outer}"));
            return;
        };
        for (k, want) in fields {
            if r[k] != *want {
                why.push(format!("<- {outer}: {k} {}, expected {want}", r[k]));
            }
        }
    };
    expect(
        "memtrace_workload::main",
        &[
            ("status", "grew".into()),
            ("count_a", 41.into()),
            ("count_b", 61.into()),
            ("delta", 20.into()),
            ("delta_bytes", (20 * 4096).into()),
        ],
    );
    expect(
        "raw_brk_deep",
        &[
            ("status", "appeared".into()),
            ("count_b", 6.into()),
            ("delta_bytes", (5 * 4096).into()),
        ],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(outer: &str, status: &str, a: u64, b: u64, bytes: u64) -> Value {
        serde_json::json!({
            "type": "diff",
            "user_stack": ["memtrace_workload::grow_heap_with_raw_brk [w]", outer],
            "status": status,
            "count_a": a,
            "count_b": b,
            "delta": b - a,
            "delta_bytes": bytes,
        })
    }

    #[test]
    fn diff_rows_must_show_the_growth_and_the_new_stack() {
        let mut why = Vec::new();
        let main = "memtrace_workload::main [w]";
        let deep = "memtrace_workload::raw_brk_deep [w]";
        let v = [
            row(main, "grew", 41, 61, 20 * 4096),
            row(deep, "appeared", 0, 6, 5 * 4096),
        ];
        diff(&v, &mut why);
        assert!(why.is_empty(), "{why:?}");
        diff(&v[..1], &mut why);
        assert_eq!(why.len(), 1, "{why:?}");
    }
}
