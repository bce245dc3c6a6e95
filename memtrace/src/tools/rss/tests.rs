//! Tests of the parent module, kept apart to keep it short.
use super::*;

#[test]
fn sizes() {
    assert_eq!(parse_size("5MiB").unwrap(), 5 << 20);
    assert_eq!(parse_size("512M").unwrap(), 512 << 20);
    assert_eq!(parse_size("1G").unwrap(), 1 << 30);
    assert_eq!(parse_size("4096").unwrap(), 4096);
    assert!(parse_size("lots").is_err());
    assert_eq!(Exclude::parse("24MiB"), Exclude::Size(24 << 20));
    assert_eq!(
        Exclude::parse("guest_mem"),
        Exclude::Name("guest_mem".into())
    );
}

#[test]
fn smaps_rss_and_pss() {
    let t = "7f0000000000-7f0000400000 rw-p 00000000 00:00 0 \n\
             Size:               4096 kB\n\
             Rss:                1024 kB\n\
             Pss:                 512 kB\n\
             55d1c0a00000-55d1c0a21000 r-xp 00001000 fe:01 1234567 /usr/bin/prog\n\
             Rss:                  12 kB\n\
             Pss:                  12 kB\n";
    let m = crate::process::proc::parse_smaps(t);
    assert_eq!(m.len(), 2);
    assert_eq!((m[0].rss, m[0].pss), (1024 * 1024, 512 * 1024));
    assert_eq!(m[1].name, "/usr/bin/prog");
    assert_eq!(excluded_bytes(&m, &[Exclude::Size(4 << 20)]), 1024 * 1024);
    assert_eq!(
        excluded_bytes(&m, &[Exclude::Name("prog".into())]),
        12 * 1024
    );
}
