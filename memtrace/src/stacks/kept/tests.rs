use super::*;

fn key(tgid: u32, ustack: i32) -> StackKey {
    StackKey {
        tgid,
        ustack,
        kstack: -1,
        ustack_check: 7,
        gen: 0,
        forked: 0,
    }
}

fn val(count: u64) -> StackVal {
    StackVal {
        count,
        bytes: count * 10,
        ..Default::default()
    }
}

#[test]
fn only_the_stacks_of_exited_processes_fold_and_no_count_is_lost() {
    let mut k = Kept::new(4);
    for s in 0..3 {
        k.add(key(1, s), &val(10));
        k.add(key(2, s), &val(5));
    }
    // A key without a stack (counted by process) never folds.
    k.add(key(2, -1), &val(1));
    assert_eq!(k.bound(|tgid| tgid == 1), 3);
    assert_eq!(k.folded, 3);
    assert_eq!(k.counts.len(), 5);
    let folded = &k.counts[&StackKey {
        tgid: 2,
        ustack: USTACK_FOLDED,
        kstack: -1,
        ustack_check: 0,
        gen: 0,
        forked: 0,
    }];
    assert_eq!((folded.count, folded.bytes), (15, 150));
    assert_eq!(k.counts[&key(2, -1)].count, 1);
    for s in 0..3 {
        assert_eq!(k.counts[&key(1, s)].count, 10);
    }
    // Folded counts stay as they are on the next round.
    k.max = 1;
    assert_eq!(k.bound(|tgid| tgid == 1), 0);
    // Under the bound nothing moves.
    let mut k = Kept::new(8);
    k.add(key(2, 0), &val(1));
    assert_eq!(k.bound(|_| false), 0);
    assert_eq!(k.folded, 0);
}

#[test]
fn walked_stacks_only_resolved_keys_named_are_let_go() {
    use crate::stacks::store::StackStore;
    use memtrace_common::stacks::{ustack_key, UserStack, MAX_UFRAMES};
    let mut store = StackStore::new();
    for id in [1u32, 2, 3] {
        let mut s = UserStack {
            hash: id as u64,
            nr: 1,
            _pad: 0,
            ips: [0; MAX_UFRAMES],
        };
        s.ips[0] = 0x1000 * id as u64;
        store.keep(ustack_key(id as i32, 7), &s);
    }
    let mut k = Kept::new(100);
    // Process 10 exits: stack 1 is its own, stack 2 live process 11's
    // too; stack 3 only process 11's.
    k.add(key(10, 1), &val(1));
    k.add(key(10, 2), &val(1));
    k.add(key(11, 2), &val(1));
    k.add(key(11, 3), &val(1));
    let report = |k: &StackKey, _: &StackVal| {
        Some(StackReport {
            pid: k.tgid,
            comm: "w".into(),
            count: 1,
            user: vec![format!("f{}", k.ustack).into()],
            ..Default::default()
        })
    };
    // Resolved one call after the process was first seen gone.
    assert_eq!(k.resolve_exited(|p| p == 11, report), 0);
    k.settle_stacks(&mut store);
    assert_eq!(store.released, 0);
    assert_eq!(k.resolve_exited(|p| p == 11, report), 2);
    k.settle_stacks(&mut store);
    assert_eq!(store.released, 1);
    assert_eq!(store.get(1, 7), None);
    assert_eq!(store.get(2, 7), Some(vec![0x2000]));
    assert_eq!(store.get(3, 7), Some(vec![0x3000]));
    // Nothing resolved since: nothing more let go.
    k.settle_stacks(&mut store);
    assert_eq!(store.released, 1);
}

#[test]
fn a_stack_that_cannot_be_read_is_a_row_with_its_reason_once() {
    let mut k = Kept::new(100);
    k.add(key(10, 1), &val(3));
    let calls = std::cell::Cell::new(0);
    let report = |k: &StackKey, _: &StackVal| {
        calls.set(calls.get() + 1);
        resolved(StackReport {
            pid: k.tgid,
            comm: "w".into(),
            count: 3,
            note: Some("stack id no longer in the stack map".into()),
            ..Default::default()
        })
    };
    assert_eq!(k.resolve_exited(|_| false, report), 0);
    assert_eq!(k.resolve_exited(|_| false, report), 1);
    // Never looked up again: a lookup counts as a lost stack.
    assert_eq!(k.resolve_exited(|_| false, report), 0);
    assert_eq!(calls.get(), 1);
    let rows = k.resolved_reports(false);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].count, 3);
    assert_eq!(
        rows[0].note.as_deref(),
        Some("stack id no longer in the stack map")
    );
}
