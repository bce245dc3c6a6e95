use super::*;

fn shown(s: &str) -> Shown {
    Shown::from(s)
}

#[test]
fn a_stack_splits_at_its_python_section() {
    let f1 = frame::encode(0x7f00_0000_1000, 30, false);
    let f2 = frame::encode(0x7f00_0000_2000, 40, true);
    let ips = [0x401000, 0x402000, frame::begin(11, 77), f1, f2];
    let (native, s) = split(&ips);
    assert_eq!(native, &[0x401000, 0x402000]);
    assert_eq!(
        s,
        Some(Section {
            tgid: 77,
            minor: 11,
            frames: vec![f1, f2]
        })
    );
    assert_eq!(split(&ips[..2]), (&ips[..2], None));
}

#[test]
fn each_eval_loop_frame_takes_its_own_calls_frames() {
    let native: Vec<Shown> = [
        "memset [libc.so.6]",
        "_PyEval_EvalFrameDefault [python3.11]",
        "PyObject_Call [python3.11]",
        "_PyEval_EvalFrameDefault [python3.11]",
        "Py_RunMain [python3.11]",
        "main [python3.11]",
    ]
    .map(shown)
    .to_vec();
    let py = [
        (shown("inner (a.py:3) [python]"), false),
        (shown("middle (a.py:7) [python]"), true),
        (shown("<module> (a.py:9) [python]"), true),
    ];
    let got = merge(native, &py);
    let want = [
        "memset [libc.so.6]",
        "inner (a.py:3) [python]",
        "middle (a.py:7) [python]",
        "PyObject_Call [python3.11]",
        "<module> (a.py:9) [python]",
        "Py_RunMain [python3.11]",
        "main [python3.11]",
    ];
    assert_eq!(got.iter().map(|s| &**s).collect::<Vec<_>>(), want);
}

#[test]
fn python_frames_past_the_native_unwind_go_after_it() {
    let native: Vec<Shown> = ["_PyEval_EvalFrameDefault [python3.12]"]
        .map(shown)
        .to_vec();
    let py = [
        (shown("a (x.py:1) [python]"), true),
        (shown("b (x.py:2) [python]"), true),
    ];
    let got = merge(native, &py);
    assert_eq!(
        got.iter().map(|s| &**s).collect::<Vec<_>>(),
        ["a (x.py:1) [python]", "b (x.py:2) [python]"]
    );
}

/// The interpreters of this host, where they are: each is CPython's
/// runtime in a version with a layout, `_PyRuntime` inside the file.
#[test]
fn this_hosts_interpreters_are_found_with_their_versions() {
    let mut n = 0;
    let pyenv = std::fs::read_dir("/root/.pyenv/versions")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("lib"));
    for dir in pyenv.chain([std::path::PathBuf::from("/usr/bin")]) {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let minor = match name
                .strip_prefix("libpython3.")
                .or(name.strip_prefix("python3."))
            {
                Some(rest) => rest.split('.').next().and_then(|m| m.parse::<u32>().ok()),
                None => None,
            };
            let Some(minor) = minor.filter(|_| !name.ends_with(".a") && !name.contains("-config"))
            else {
                continue;
            };
            let Ok(f) = File::open(e.path()) else {
                continue;
            };
            let rt = classify_file(&name, &f);
            if name.starts_with("python") && rt == Runtime::None {
                // An executable linked with libpython keeps its runtime there.
                continue;
            }
            match rt {
                Runtime::Walked {
                    minor: m,
                    off,
                    types,
                } => {
                    assert_eq!(m, minor, "{name}");
                    assert!(off > 0 && !types.contains(&0), "{name}");
                    n += 1;
                }
                Runtime::Not(why) => assert!(
                    !(FIRST_MINOR..=LAST_MINOR).contains(&minor),
                    "{name}: {why}"
                ),
                Runtime::None => {}
            }
        }
    }
    if n == 0 {
        eprintln!("skipped: no CPython 3.11 to 3.13 on this host");
    }
}
