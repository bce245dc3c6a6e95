//! Parsers over files saved from this project's machine (cgroup v1 memory
//! controller, Linux 6.18); the v2 ones are written as the kernel's
//! cgroup-v2.rst documents them (no v2 memory controller on the host).

use super::*;

macro_rules! data {
    ($f:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/memcg/",
            $f
        ))
    };
}

#[test]
fn v1_limits_none_is_a_huge_number() {
    assert_eq!(
        parse_limit(data!("v1-parent.memory.limit_in_bytes")),
        Some(128 << 20)
    );
    assert_eq!(parse_limit(data!("v1-child.memory.limit_in_bytes")), None);
    assert_eq!(parse_limit(data!("v1-root.memory.limit_in_bytes")), None);
    assert_eq!(parse_limit("max\n"), None);
    assert_eq!(parse_limit("4096\n"), Some(4096));
}

#[test]
fn v1_stat_is_hierarchical_and_shmem_leaves_cache() {
    // 20 MiB written to /dev/shm and ~2 MiB of file cache, nothing anonymous.
    let st = parse_stat(data!("v1-child.memory.stat"), Version::V1);
    assert_eq!(
        st,
        MemStat {
            anon: 0,
            file: 22945792 - 20971520,
            shmem: 20971520,
        }
    );
    // The parent's totals include the child's.
    let p = parse_stat(data!("v1-parent.memory.stat"), Version::V1);
    assert_eq!(p.shmem, 20971520);
}

#[test]
fn v1_events_from_failcnt_and_oom_control() {
    let fails = format!(
        "{}{}",
        data!("v1-oom-parent.memory.failcnt"),
        data!("v1-oom-parent.memory.memsw.failcnt")
    );
    let e = parse_events_v1(&fails, data!("v1-oom-child.memory.oom_control"));
    assert_eq!(e.oom_kill, 1);
    assert_eq!(e.max, 0);
    assert_eq!(parse_events_v1("3\n4\n", "").max, 7);
    assert_eq!(
        parse_events_v1("", data!("v1-parent.memory.oom_control")).oom_kill,
        0
    );
}

#[test]
fn v2_events_and_their_difference() {
    let a = parse_events_v2("low 0\nhigh 5\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n");
    assert_eq!(
        a,
        Events {
            high: 5,
            max: 12,
            oom: 1,
            oom_kill: 1
        }
    );
    let b = parse_events_v2("low 0\nhigh 9\nmax 20\noom 3\noom_kill 2\noom_group_kill 0\n");
    assert_eq!(
        b.since(&a),
        Events {
            high: 4,
            max: 8,
            oom: 2,
            oom_kill: 1
        }
    );
}

#[test]
fn v2_stat_file_excludes_shmem() {
    let st = parse_stat(
        "anon 1048576\nfile 3145728\nkernel 12288\nshmem 1048576\nfile_mapped 0\n",
        Version::V2,
    );
    assert_eq!(
        st,
        MemStat {
            anon: 1 << 20,
            file: 2 << 20,
            shmem: 1 << 20
        }
    );
}

#[test]
fn psi_avg10() {
    let p = parse_psi(data!("psi.memory")).unwrap();
    assert_eq!(p, Psi::default());
    let p = parse_psi(
        "some avg10=12.50 avg60=3.00 avg300=0.50 total=100\nfull avg10=7.25 avg60=1.00 avg300=0.10 total=50\n",
    )
    .unwrap();
    assert_eq!((p.some_avg10, p.full_avg10), (12.5, 7.25));
    assert!(parse_psi("").is_none());
}

#[test]
fn proc_cgroup_memory_paths() {
    let (v1, v2) = parse_proc_cgroup(data!("proc-self-cgroup").as_bytes());
    assert_eq!(
        v1.as_deref(),
        Some("/process_api/483424b265ec84216c86d71bba4397c1")
    );
    assert_eq!(v2.as_deref(), Some("/"));
    let (v1, v2) = parse_proc_cgroup(b"0::/user.slice/app.scope\n");
    assert_eq!((v1, v2.as_deref()), (None, Some("/user.slice/app.scope")));
}

/// Group names are bytes: one that is not UTF-8 is shown with `\xNN` for
/// those bytes, and its files are opened by the bytes themselves.
#[test]
fn names_that_are_not_utf8_are_shown_escaped_and_opened_as_bytes() {
    use std::os::unix::ffi::OsStrExt;
    let (v1, v2) = parse_proc_cgroup(b"4:memory:/caf\xe9/x\n0::/\n");
    assert_eq!(
        (v1.as_deref(), v2.as_deref()),
        (Some("/caf\\xe9/x"), Some("/"))
    );
    let raw = std::ffi::OsStr::from_bytes(b"/caf\xe9/x").to_owned();
    let g = Group::in_hierarchy("/sys/fs/cgroup/memory".into(), raw, Version::V1);
    assert_eq!(g.path, "/caf\\xe9/x");
    assert_eq!(
        g.dir().as_os_str().as_bytes(),
        b"/sys/fs/cgroup/memory/caf\xe9/x"
    );
    assert_eq!(g.parent().unwrap().path, "/caf\\xe9");
}

#[test]
fn parents_up_to_the_root() {
    let g = Group::in_hierarchy("/sys/fs/cgroup/memory".into(), "/a/b".into(), Version::V1);
    let p = g.parent().unwrap();
    assert_eq!(p.path, "/a");
    assert_eq!(p.parent().unwrap().path, "/");
    assert!(p.parent().unwrap().parent().is_none());
    assert_eq!(g.dir(), PathBuf::from("/sys/fs/cgroup/memory/a/b"));
}

/// A v1 parent without use_hierarchy (5.10's default) does not limit its
/// children: the limit in force is the child's own, or none.
#[test]
fn a_v1_limit_reaches_children_only_with_use_hierarchy() {
    let root = std::env::temp_dir().join(format!("memtrace-hier-{}", std::process::id()));
    let kid = root.join("a/kid");
    std::fs::create_dir_all(&kid).unwrap();
    let huge = "9223372036854771712\n";
    std::fs::write(root.join("a/memory.limit_in_bytes"), "67108864\n").unwrap();
    std::fs::write(kid.join("memory.limit_in_bytes"), huge).unwrap();
    let g = Group::in_hierarchy(root.clone(), "/a/kid".into(), Version::V1);
    for (flag, want) in [
        (None, Some(67108864)),
        (Some("1\n"), Some(67108864)),
        (Some("0\n"), None),
    ] {
        if let Some(f) = flag {
            std::fs::write(root.join("a/memory.use_hierarchy"), f).unwrap();
        }
        let got = g.limiting().map(|(l, at)| (l, at.path));
        assert_eq!(got.as_ref().map(|g| g.0), want, "{flag:?}");
        if want.is_some() {
            assert_eq!(got.unwrap().1, "/a");
        }
    }
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn psi_trigger_windows_are_one_second_or_two_without_cap_sys_resource() {
    assert_eq!(notify::psi_line("some", 10.0, true), "some 100000 1000000");
    assert_eq!(notify::psi_line("full", 5.0, false), "full 100000 2000000");
}
