//! The record's own reading and writing, cut and damaged files included.

use super::*;

fn header() -> Header {
    Header {
        magic: MAGIC.into(),
        version: VERSION,
        memtrace: "0".into(),
        tool: "faults".into(),
        args: vec!["faults".into()],
        kernel: "6.18".into(),
        host: "h".into(),
        start: 1.0,
        style: "function".into(),
        per_pid: false,
    }
}

fn report(seq: u64) -> Item {
    let s = StackReport {
        pid: 7,
        comm: "w".into(),
        count: 3,
        user: vec!["grow (a.rs:3) [w]".into()],
        ..Default::default()
    };
    Item::Report(Report {
        seq,
        at: 0.5,
        kind: "fault_stack".into(),
        title: String::new(),
        stacks: vec![Stack::from_report(&s)],
        build_ids: BTreeMap::new(),
    })
}

fn file(n: u64, trailer: bool) -> Vec<u8> {
    let mut b = Vec::new();
    write_start(&mut b, header()).unwrap();
    let mut items = crate::record::stream::Items::new(&mut b);
    for i in 0..n {
        items.write(&report(i)).unwrap();
    }
    if trailer {
        items.write(&Item::Trailer(Trailer::default())).unwrap();
        items.finish().unwrap();
        drop(items);
    } else {
        // Cut short: the stream never ended (dropping would end it).
        std::mem::forget(items);
    }
    b
}

#[test]
fn reads_what_it_wrote() {
    let r = Recording::read(&file(3, true)[..], "f").unwrap();
    assert_eq!(r.reports.len(), 3);
    assert!(r.trailer.is_some() && r.warning("f").is_none());
    let s = &r.reports[2].stacks[0];
    assert_eq!(s.user[0].line, Some(3));
    assert_eq!(&*s.to_report(FrameStyle::Function).user[0], "grow [w]");
}

#[test]
fn a_file_cut_anywhere_reads_to_its_last_whole_item() {
    let whole = file(3, false);
    let two = file(2, false).len();
    assert_eq!(
        whole[..two],
        file(2, false)[..],
        "one stream, flushed per item"
    );
    // The third item reads once its bytes have all come out of the
    // stream (before the flush's own marker), never before.
    let mut last = 2;
    for cut in two..whole.len() {
        let r = Recording::read(&whole[..cut], "f").unwrap();
        let n = r.reports.len();
        assert!(n == 2 || (n == 3 && cut > two + 8), "cut at {cut}: {n}");
        assert!(n >= last, "cut at {cut}");
        last = n;
        assert_eq!(
            r.warning("f").unwrap(),
            format!("f: truncated after {n} records (the run was cut short)")
        );
    }
    assert_eq!(Recording::read(&whole[..], "f").unwrap().reports.len(), 3);
}

#[test]
fn damage_in_the_middle_is_an_error_that_says_where() {
    let f = file(3, true);
    let two = file(2, false).len();
    // Each byte of the third report in turn: the stream fails to
    // inflate, or what it gives fails the item's checksum.
    for at in two + 2..two + 12 {
        let mut bad = f.clone();
        bad[at] ^= 0x40;
        let e = Recording::read(&bad[..], "f").unwrap_err();
        let m = e.to_string();
        let told = m.starts_with("f: the item at byte") && m.contains("checksum")
            || m.starts_with("f: the compressed items are damaged")
            || m.contains("not an item");
        assert!(told, "{m}");
        assert_eq!(e.exit_code(), 1);
    }
}

#[test]
fn other_files_are_refused() {
    for bad in [&b""[..], b"hello world", &[0xd9, 0xd9, 0xf7, 0x01]] {
        let e = Recording::read(bad, "x").unwrap_err();
        assert_eq!(e.to_string(), "x is not a memtrace record file");
        assert_eq!(e.exit_code(), 2);
    }
}
