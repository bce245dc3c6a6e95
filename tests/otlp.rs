//! `--otlp`: OpenTelemetry profiles read back by protoc against
//! opentelemetry-proto's published schema (tests/otlp), not by memtrace,
//! with exact figures from workloads with known counts, and the container
//! a process ran in named as the semantic conventions have it.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;

/// protoc's text for an OTLP file, or None (with a skip) without protoc.
fn decode(test: &str, file: &Path) -> Option<String> {
    if !installed("protoc", "--version") {
        skip(test, "protoc is not installed (apt protobuf-compiler)");
        return None;
    }
    let raw = std::fs::read(file).unwrap();
    let schema = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("otlp");
    let mut p = Command::new("protoc")
        .arg(format!("--proto_path={}", schema.display()))
        .args([
            "--decode=opentelemetry.proto.profiles.v1development.ProfilesData",
            "opentelemetry/proto/profiles/v1development/profiles.proto",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut p.stdin.take().unwrap(), &raw).unwrap();
    let out = p.wait_with_output().unwrap();
    assert!(out.status.success(), "protoc could not decode it");
    Some(String::from_utf8(out.stdout).unwrap())
}

/// A message as protoc prints it: fields in order, scalars as text.
#[derive(Default, Debug)]
struct Msg(Vec<(String, Field)>);

#[derive(Debug)]
enum Field {
    Scalar(String),
    Msg(Msg),
}

impl Msg {
    fn parse(lines: &mut std::str::Lines) -> Msg {
        let mut m = Msg::default();
        while let Some(l) = lines.next() {
            let t = l.trim();
            if t == "}" {
                break;
            }
            if let Some(name) = t.strip_suffix(" {") {
                m.0.push((name.into(), Field::Msg(Msg::parse(lines))));
            } else if let Some((k, v)) = t.split_once(": ") {
                m.0.push((k.into(), Field::Scalar(v.trim_matches('"').into())));
            }
        }
        m
    }

    fn msgs(&self, name: &str) -> Vec<&Msg> {
        let m = self.0.iter().filter(|f| f.0 == name);
        m.filter_map(|f| match &f.1 {
            Field::Msg(m) => Some(m),
            _ => None,
        })
        .collect()
    }

    fn msg(&self, name: &str) -> &Msg {
        self.msgs(name)
            .pop()
            .unwrap_or_else(|| panic!("no {name} in {self:?}"))
    }

    fn scalars(&self, name: &str) -> Vec<&str> {
        let m = self.0.iter().filter(|f| f.0 == name);
        m.filter_map(|f| match &f.1 {
            Field::Scalar(s) => Some(s.as_str()),
            _ => None,
        })
        .collect()
    }

    /// A number field, 0 when absent (proto3's default is not printed).
    fn num(&self, name: &str) -> i64 {
        self.scalars(name).first().map_or(0, |s| s.parse().unwrap())
    }
}

/// A profile resolved through the dictionary: its type, and per sample the
/// leaf-first function names, the value and the attributes.
struct Profile {
    ty: (String, String),
    samples: Vec<(Vec<String>, i64, HashMap<String, String>)>,
}

fn parse(text: &str) -> (Vec<Profile>, Msg) {
    let root = Msg::parse(&mut text.lines());
    let dict = root.msg("dictionary");
    let strings: Vec<&str> = dict.scalars("string_table");
    let s = |i: i64| strings[i as usize].to_string();
    let functions: Vec<String> = dict
        .msgs("function_table")
        .iter()
        .map(|f| s(f.num("name_strindex")))
        .collect();
    let locations: Vec<String> = dict
        .msgs("location_table")
        .iter()
        .map(|l| match l.msgs("lines").first() {
            Some(line) => functions[line.num("function_index") as usize].clone(),
            None => String::new(),
        })
        .collect();
    let stacks: Vec<Vec<String>> = dict
        .msgs("stack_table")
        .iter()
        .map(|st| {
            st.scalars("location_indices")
                .iter()
                .map(|i| locations[i.parse::<usize>().unwrap()].clone())
                .collect()
        })
        .collect();
    let attributes: Vec<(String, String)> = dict
        .msgs("attribute_table")
        .iter()
        .map(|a| {
            let v = a.msgs("value");
            let v = v.first().map_or(String::new(), |v| {
                let (sv, iv) = (v.scalars("string_value"), v.scalars("int_value"));
                sv.first().or(iv.first()).unwrap_or(&"").to_string()
            });
            (s(a.num("key_strindex")), v)
        })
        .collect();
    let mut out = Vec::new();
    for rp in root.msgs("resource_profiles") {
        for sp in rp.msgs("scope_profiles") {
            assert_eq!(sp.msg("scope").scalars("name"), ["memtrace"]);
            for p in sp.msgs("profiles") {
                let t = p.msg("sample_type");
                let samples = p
                    .msgs("samples")
                    .iter()
                    .map(|x| {
                        let attrs = x
                            .scalars("attribute_indices")
                            .iter()
                            .map(|i| attributes[i.parse::<usize>().unwrap()].clone())
                            .collect();
                        let v: Vec<i64> = x
                            .scalars("values")
                            .iter()
                            .map(|v| v.parse().unwrap())
                            .collect();
                        assert_eq!(v.len(), 1, "one value per sample");
                        (stacks[x.num("stack_index") as usize].clone(), v[0], attrs)
                    })
                    .collect();
                out.push(Profile {
                    ty: (s(t.num("type_strindex")), s(t.num("unit_strindex"))),
                    samples,
                });
            }
        }
    }
    (out, root)
}

/// The value summed over samples whose leaf frame is in `func`.
fn at_leaf(p: &Profile, func: &str) -> i64 {
    let at = p
        .samples
        .iter()
        .filter(|s| s.0.first().is_some_and(|f| f.contains(func)));
    at.map(|s| s.1).sum()
}

fn scratch(name: &str) -> PathBuf {
    scratch_dir("otlp", name)
}

/// memleak's live --otlp and report --otlp of its record, the workload in
/// a group named as Docker names its containers' scopes: in-use objects
/// and bytes at the leaking functions exactly, one profile per sample
/// type, each sample naming its process and container.
#[test]
fn memleak_otlp_holds_the_leaks_exactly_with_their_container() {
    let test = "memleak_otlp_holds_the_leaks_exactly_with_their_container";
    if memcg_root().is_none() {
        return skip(test, "no memory cgroup controller");
    }
    let id = format!(
        "{:064x}",
        std::process::id() as u128 * 0x9e37_79b9_7f4a_7c15
    );
    let cg = Memcg::named(&format!("docker-{id}.scope"), "1G", false);
    let d = scratch("memleak");
    let (live, rec, from_rec) = (d.join("live.pb"), d.join("m.rec"), d.join("rec.pb.gz"));
    let pprof = d.join("live.pprof.gz");
    // 7 blocks of 1,000 bytes and 3 of 1 MiB held, 200 rounds freed; the
    // shell joins the group before the workload execs.
    let cmd = format!(
        "sh -c 'echo $$ > {}/cgroup.procs && exec {} leak 7 1000 3 1048576 200 0'",
        cg.path.display(),
        workload_bin().display()
    );
    let out = run(&[
        "memleak",
        "-c",
        &cmd,
        "--otlp",
        live.to_str().unwrap(),
        "--pprof",
        pprof.to_str().unwrap(),
        "--record",
        rec.to_str().unwrap(),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    // pprof labels the same samples: their strings are in its table.
    let mut raw = Vec::new();
    let gz = std::fs::read(&pprof).unwrap();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut raw).unwrap();
    let has = |s: &str| raw.windows(s.len()).any(|w| w == s.as_bytes());
    assert!(
        has("container_id") && has(&id) && has("cgroup"),
        "pprof lacks the container"
    );
    let rep = run(&[
        "report",
        rec.to_str().unwrap(),
        "--otlp",
        from_rec.to_str().unwrap(),
    ]);
    assert_eq!(rep.code, 0, "{}", rep.stderr);
    let gz = std::fs::read(&from_rec).unwrap();
    assert_eq!(&gz[..2], [0x1f, 0x8b], "OUT.gz is gzip'd");
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut raw).unwrap();
    let unzipped = d.join("rec.pb");
    std::fs::write(&unzipped, raw).unwrap();
    for file in [&live, &unzipped] {
        let Some(text) = decode(test, file) else {
            return;
        };
        let (profiles, root) = parse(&text);
        let types: Vec<(&str, &str)> = profiles
            .iter()
            .map(|p| (p.ty.0.as_str(), p.ty.1.as_str()))
            .collect();
        assert_eq!(
            types,
            [("inuse_objects", "count"), ("inuse_space", "bytes")]
        );
        let (objects, space) = (&profiles[0], &profiles[1]);
        assert_eq!(at_leaf(objects, "leak_small_blocks"), 7, "{text}");
        assert_eq!(at_leaf(space, "leak_small_blocks"), 7000, "{text}");
        assert_eq!(at_leaf(objects, "leak_big_blocks"), 3, "{text}");
        assert_eq!(at_leaf(space, "leak_big_blocks"), 3 << 20, "{text}");
        let leak = objects
            .samples
            .iter()
            .find(|s| s.0.first().is_some_and(|f| f.contains("leak_small_blocks")))
            .unwrap();
        assert_eq!(
            leak.2["process.executable.name"], "memtrace-worklo",
            "{text}"
        );
        assert!(leak.2["process.pid"].parse::<u32>().is_ok(), "{text}");
        assert_eq!(leak.2["container.id"], id, "{text}");
        assert!(leak.2["process.linux.cgroup"].contains(&id), "{text}");
        // The dictionaries start with their zero items, and the libraries
        // the stacks go through carry their build ids.
        let dict = root.msg("dictionary");
        assert_eq!(dict.scalars("string_table")[0], "");
        assert!(dict.msgs("location_table")[0].0.is_empty());
        assert!(text.contains("process.executable.build_id.gnu"), "{text}");
    }
}

/// A one-request OTLP/HTTP receiver on a local port: the request line and
/// body of the POST it gets, answered with `status`.
fn receiver(status: &'static str) -> (u16, std::thread::JoinHandle<(String, Vec<u8>)>) {
    use std::io::{BufRead, Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        let mut r = std::io::BufReader::new(s);
        let mut first = String::new();
        r.read_line(&mut first).unwrap();
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            r.read_line(&mut h).unwrap();
            if h.trim().is_empty() {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0u8; len];
        r.read_exact(&mut body).unwrap();
        let mut s = r.into_inner();
        let _ = s.write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes());
        (first.trim().to_string(), body)
    });
    (port, h)
}

/// `--otlp-push`: the profiles POSTed to an OTLP/HTTP receiver as the spec
/// has it (the path for profiles, protobuf), exact as the file is; a
/// receiver that refuses them is a failure (exit 1, one line), and a URL
/// that is not http:// bad input (exit 2).
#[test]
fn otlp_push_posts_the_profiles_and_a_refusal_fails_the_run() {
    let test = "otlp_push_posts_the_profiles_and_a_refusal_fails_the_run";
    let d = scratch("push");
    let rec = d.join("m.rec");
    let cmd = format!("{} leak 7 1000 3 1048576 200 0", workload_bin().display());
    let out = run(&["memleak", "-c", &cmd, "--record", rec.to_str().unwrap()]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let (port, got) = receiver("200 OK");
    let url = format!("http://127.0.0.1:{port}");
    let rep = run(&["report", rec.to_str().unwrap(), "--otlp-push", &url]);
    assert_eq!(rep.code, 0, "{}", rep.stderr);
    let (request, body) = got.join().unwrap();
    assert_eq!(request, "POST /v1development/profiles HTTP/1.1");
    let file = d.join("pushed.pb");
    std::fs::write(&file, body).unwrap();
    let Some(text) = decode(test, &file) else {
        return;
    };
    let (profiles, _) = parse(&text);
    assert_eq!(at_leaf(&profiles[0], "leak_small_blocks"), 7, "{text}");
    assert_eq!(at_leaf(&profiles[1], "leak_big_blocks"), 3 << 20, "{text}");
    let (port, got) = receiver("400 Bad Request");
    let url = format!("http://127.0.0.1:{port}/custom");
    let rep = run(&["report", rec.to_str().unwrap(), "--otlp-push", &url]);
    assert_eq!(rep.code, 1, "{}", rep.stderr);
    assert_eq!(got.join().unwrap().0, "POST /custom HTTP/1.1");
    assert_eq!(rep.stderr.trim().lines().count(), 1, "{}", rep.stderr);
    assert!(rep.stderr.contains("400 Bad Request"), "{}", rep.stderr);
    let bad = run(&["report", rec.to_str().unwrap(), "--otlp-push", "https://x"]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
}
