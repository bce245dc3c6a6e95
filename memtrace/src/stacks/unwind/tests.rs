use super::*;

fn info(bytes: usize) -> Option<Arc<ObjectInfo>> {
    Some(Arc::new(ObjectInfo {
        text: None,
        eh_frame: Some((0..bytes as u64, Arc::from(vec![0u8; bytes]))),
        eh_frame_hdr: None,
        debug_frame: None,
        segments: Vec::new(),
    }))
}

fn with(objects: &[(u64, u64, usize)]) -> DwarfUnwinder {
    let mut u = DwarfUnwinder::default();
    for &(inode, used, bytes) in objects {
        let o = Held {
            info: info(bytes),
            used,
        };
        u.objects.insert(((8, 1), inode), o);
    }
    u
}

#[test]
fn spare_unwind_info_is_bounded_by_bytes_keeping_the_most_recent() {
    let mib = 1 << 20;
    // Three binaries no live process maps, 20 MiB each: only the one used
    // last fits under the spare bytes.
    let mut u = with(&[(1, 1, 20 * mib), (2, 3, 20 * mib), (3, 2, 20 * mib)]);
    u.forget_exited(|_| false);
    let left: Vec<u64> = u.objects.keys().map(|k| k.1).collect();
    assert_eq!(left, vec![2]);
    assert_eq!(u.held(), (1, 20 * mib));
}

#[test]
fn spare_unwind_info_is_bounded_by_count_keeping_the_most_recent() {
    let many: Vec<(u64, u64, usize)> = (0..100).map(|i| (i, i, 10)).collect();
    let mut u = with(&many);
    u.forget_exited(|_| false);
    assert_eq!(u.objects.len(), 64);
    assert!(
        u.objects.keys().all(|k| k.1 >= 36),
        "the 64 most recent stay"
    );
}

#[test]
fn a_few_small_binaries_stay_for_the_next_short_process() {
    let mut u = with(&[(1, 1, 4096), (2, 2, 4096)]);
    u.forget_exited(|_| false);
    assert_eq!(u.objects.len(), 2);
}
