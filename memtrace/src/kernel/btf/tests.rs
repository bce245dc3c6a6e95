//! Tests of the parent module, kept apart to keep it short.
use super::*;

fn saved() -> KernelBtf {
    // vmlinux BTF saved from this project's 6.18 kernel (gzip).
    let gz = include_bytes!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/vmlinux-6.18.btf.gz"
    ));
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut raw).unwrap();
    KernelBtf::from_vec(raw).unwrap()
}

#[test]
fn task_struct_offsets_match_the_hand_checked_ones() {
    // Figures from shared/kernel-notes.md, read by hand with pahole-like tools.
    let b = saved();
    assert_eq!(b.offset("task_struct", "pid"), Some(1264));
    assert_eq!(b.offset("task_struct", "tgid"), Some(1268));
    assert_eq!(b.offset("task_struct", "comm"), Some(1752));
    assert_eq!(b.offset("oom_control", "totalpages"), Some(32));
    assert_eq!(b.offset("oom_control", "chosen"), Some(40));
    assert_eq!(b.offset("task_struct", "no_such_member"), None);
}

#[test]
fn resolves_everything_tools_need() {
    let b = saved();
    let t = b.task_offsets().unwrap();
    assert_eq!(t.valid, 1);
    // Member inside an anonymous union/struct of mm_struct.
    assert!(t.mm_brk > 0 && t.mm_rss_stat > 0);
    // 6.18: struct percpu_counter rss_stat[], the shared count at 8.
    assert_eq!((t.rss_stride, t.rss_count), (40, 8));
    assert!(b.enumerator("cgroup_subsys_id", "memory_cgrp_id").is_some());
    assert!(b.has_func("oom_kill_process"));
    assert!(b.has_btf_tracepoint("mark_victim"));
    assert!(!b.has_btf_tracepoint("no_such_tracepoint"));
}

#[test]
fn a_missing_member_is_an_error_naming_it_never_offset_zero() {
    let b = saved();
    let mut r = b.resolver();
    assert_eq!(r.member("task_struct", "pid"), 1264);
    r.member("task_struct", "no_such_member");
    r.enumerator("cgroup_subsys_id", "no_such_id");
    let e = r.done("a test", ()).unwrap_err().to_string();
    assert!(e.contains("task_struct.no_such_member"), "{e}");
    assert!(e.contains("no_such_id"), "{e}");
    assert!(b.resolver().done("nothing", 7).is_ok());
}

#[test]
fn enumerators_of_enums_without_a_name_are_found() {
    // `enum { MM_FILEPAGES, MM_ANONPAGES, MM_SWAPENTS, MM_SHMEMPAGES }`.
    let b = saved();
    let v: Vec<Option<u32>> = [
        "MM_FILEPAGES",
        "MM_ANONPAGES",
        "MM_SWAPENTS",
        "MM_SHMEMPAGES",
    ]
    .iter()
    .map(|n| b.enumerator("", n))
    .collect();
    assert_eq!(v, [Some(0), Some(1), Some(2), Some(3)]);
    assert_eq!(b.enumerator("", "MM_NO_SUCH_COUNTER"), None);
}

/// A BTF blob of `types` (u32 words) and `strs` (starting with the empty name).
fn blob(types: &[u32], strs: &[u8]) -> Vec<u8> {
    let tl = types.len() as u32 * 4;
    let mut d = vec![0x9f, 0xeb, 1, 0];
    for w in [24, 0, tl, tl, strs.len() as u32] {
        d.extend(w.to_le_bytes());
    }
    types.iter().for_each(|w| d.extend(w.to_le_bytes()));
    d.extend(strs);
    d
}

const fn info(kind: u32, vlen: u32) -> u32 {
    kind << 24 | vlen
}

#[test]
fn anonymous_members_pointing_back_at_their_struct_are_searched_once() {
    // struct s (id 1) whose 6 members are all anonymous and of type s: the
    // old search read 6 + 6^2 + ... + 6^9 (12 million) members for a name
    // that is not there; a fuzz input of this shape took 13 s.
    let mut t = vec![1, info(STRUCT, 6), 8];
    for _ in 0..6 {
        t.extend([0, 1, 0]);
    }
    let b = KernelBtf::from_vec(blob(&t, b"\0s\0")).unwrap();
    let mut w = Walk::default();
    assert_eq!(b.find_in(1, "x", 0, &mut w), None);
    assert_eq!(w.members, 6);
    assert_eq!(b.offset("s", "x"), None);
}

#[test]
fn names_sharing_the_hashed_prefix_are_told_apart() {
    // Two structs whose names differ only past the hashed bytes.
    let long = "n".repeat(HASHED + 6);
    let strs = format!("\0{long}a\0{long}b\0");
    let second = 1 + long.len() as u32 + 2;
    let t = [1, info(STRUCT, 1), 16, 0, 0, 0];
    let t: Vec<u32> = t
        .iter()
        .chain(&[second, info(STRUCT, 1), 32, 0, 0, 0])
        .copied()
        .collect();
    let b = KernelBtf::from_vec(blob(&t, strs.as_bytes())).unwrap();
    assert_eq!(b.size(&format!("{long}a")), Some(16));
    assert_eq!(b.size(&format!("{long}b")), Some(32));
    assert_eq!(b.size(&long), None);
}
