use super::text::{placeless, NOT_PLACED};
use super::*;

#[test]
fn parses_maps_lines() {
    let t = "55d1c0a00000-55d1c0a21000 r-xp 00001000 fe:01 1234567 /usr/bin/my prog\n\
             7ffd4a000000-7ffd4a021000 rw-p 00000000 00:00 0 [stack]\n\
             7f0000000000-7f0000001000 rw-p 00000000 00:00 0\n";
    let m = parse_maps(t);
    assert_eq!(m.len(), 3);
    assert_eq!(m[0].start, 0x55d1c0a00000);
    assert_eq!(m[0].offset, 0x1000);
    assert_eq!(m[0].dev, (0xfe, 1));
    assert_eq!(m[0].inode, 1234567);
    assert_eq!(&*m[0].path, "/usr/bin/my prog");
    assert_eq!(&*m[1].path, "[stack]");
    assert_eq!(&*m[2].path, "");
}

#[test]
fn maps_of_exited_processes_are_let_go_past_the_bound() {
    let mut c = MapsCache::default();
    let me = std::process::id();
    assert!(c.snapshot(me));
    let maps = c.procs[&me].maps.clone();
    // Pids above any pid_max: processes that have exited.
    for p in 0..MAX_PROCS as u32 * 3 {
        let pid = 5_000_000 + p;
        c.keep(pid);
        let (maps, earlier) = (maps.clone(), Vec::new());
        c.procs.insert(pid, Snapshot { maps, earlier });
        assert!(c.procs.len() <= MAX_PROCS, "{}", c.procs.len());
    }
    // The live process stays, with the files it maps.
    assert!(c.has(me));
    assert!(c
        .locate(
            me,
            maps.iter().find(|m| m.perms.contains('x')).unwrap().start
        )
        .is_some());
    assert!(!c.files.is_empty());
    assert!(c.order.len() == c.procs.len());
}

/// A parent read again at each fork kept a new copy each time, and each
/// child the one it was given: 35-40 KB a child under `-p --children`.
#[test]
fn unchanged_maps_keep_one_copy_and_exited_ones_go_unless_looked_up_later() {
    let mut c = MapsCache::default();
    let me = std::process::id();
    assert!(c.snapshot(me));
    let first = c.procs[&me].maps.clone();
    assert!(c.snapshot(me));
    assert!(
        Arc::ptr_eq(&first, &c.procs[&me].maps),
        "read again, same copy"
    );
    // Exited children (pids above any pid_max) that were given it.
    let kids: Vec<u32> = (0..10).map(|i| 5_000_000 + i).collect();
    for &k in &kids {
        c.keep(k);
        let (maps, earlier) = (first.clone(), Vec::new());
        c.procs.insert(k, Snapshot { maps, earlier });
    }
    c.keep_exited = true;
    c.exited(&kids);
    assert!(kids.iter().all(|k| c.has(*k)), "kept for stacks after exit");
    c.keep_exited = false;
    c.exited(&kids);
    assert!(kids.iter().all(|k| !c.has(*k)), "let go at exit");
    assert!(c.has(me));
}

#[test]
fn a_path_that_is_not_utf8_keeps_its_bytes_and_the_other_maps() {
    use std::os::unix::ffi::OsStrExt;
    let t = b"1000-2000 r-xp 00000000 fe:01 7 /tmp/caf\xe9 bin\n\
              3000-4000 r-xp 00000000 fe:01 8 /usr/lib/libc.so.6\n";
    let m = crate::process::maps::parse_maps_bytes(t);
    assert_eq!(m.len(), 2);
    assert_eq!(m[0].file.as_os_str().as_bytes(), b"/tmp/caf\xe9 bin");
    assert_eq!(&*m[0].path, "/tmp/caf\u{fffd} bin");
    assert_eq!(&*m[1].path, "/usr/lib/libc.so.6");
}

/// The kernel writes a newline in a maps path as `\012`: the file is the
/// one with the newline.
#[test]
fn a_path_with_a_newline_is_the_file_with_the_newline() {
    use std::os::unix::ffi::OsStrExt;
    let t = b"1000-2000 r-xp 00000000 fe:01 7 /tmp/new\\012line/bin\n";
    let m = crate::process::maps::parse_maps_bytes(t);
    assert_eq!(m[0].file.as_os_str().as_bytes(), b"/tmp/new\nline/bin");
}

#[test]
fn symbolizes_own_function_after_normalizing() {
    #[inline(never)]
    fn marker_function_for_symbolizer() -> u64 {
        marker_function_for_symbolizer as *const () as u64
    }
    let addr = marker_function_for_symbolizer();
    let mut s = Symbolizer::new();
    let pid = std::process::id();
    let f = s.user(pid, &[addr]);
    assert!(f[0].contains("marker_function_for_symbolizer"), "{f:?}");
}

#[test]
fn unplaced_addresses_become_one_frame_and_placed_ones_stay() {
    let f = |v: &[&str]| v.iter().map(|s| Shown::from(*s)).collect::<Vec<_>>();
    let a = placeless(f(&[
        "0x7f40ba8497c9 [unknown]",
        "0x7f40ba848b78 [unknown]",
        "main [true]",
        "0x7f00 [process exited before its maps were read]",
        "0x1234 [anonymous]",
        "0x4c46 [libc.so.6]",
    ]));
    assert_eq!(
        a,
        f(&[
            NOT_PLACED,
            "main [true]",
            NOT_PLACED,
            "0x1234 [anonymous]",
            "0x4c46 [libc.so.6]"
        ])
    );
    // Two processes' stacks at different addresses are one.
    let b = placeless(f(&["0x7f6decde8df9 [unknown]", "0x7f6decdea0c5 [unknown]"]));
    assert_eq!(b, f(&[NOT_PLACED]));
}

#[test]
fn locate_finds_the_mapping_by_address_and_none_in_gaps() {
    let t = "1000-2000 r-xp 00000000 fe:01 11 /a\n\
             3000-5000 r-xp 00002000 fe:01 12 /b\n\
             5000-6000 r-xp 00000000 fe:01 13 /c\n";
    let mut c = MapsCache::default();
    let maps = Arc::new(parse_maps(t));
    c.procs.insert(
        7,
        Snapshot {
            maps,
            earlier: Vec::new(),
        },
    );
    let at = |a: u64| c.locate(7, a).map(|(m, off, _)| (m.inode, off));
    assert_eq!(at(0xfff), None);
    assert_eq!(at(0x1000), Some((11, 0)));
    assert_eq!(at(0x1fff), Some((11, 0xfff)));
    assert_eq!(at(0x2000), None);
    assert_eq!(at(0x3000), Some((12, 0x2000)));
    assert_eq!(at(0x4fff), Some((12, 0x3fff)));
    assert_eq!(at(0x5000), Some((13, 0)));
    assert_eq!(at(0x6000), None);
}
