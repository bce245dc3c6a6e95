//! systemd-oomd's prekill hook (systemd 260, Varlink `io.systemd.oom.Prekill`):
//! before it kills a cgroup, oomd calls `Notify` on every socket in
//! /run/systemd/oomd.prekill.hook/ with the group's path and waits up to
//! `PrekillHookTimeoutSec=` for the replies. `memcg --prekill` listens there
//! and replies once it has printed what it knows of the group. Varlink is
//! a JSON object per message, each ended by a NUL byte: a few lines here,
//! where a Varlink crate would bring an async runtime of its own.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where oomd looks for hooks.
pub const DIR: &str = "/run/systemd/oomd.prekill.hook";
const NOTIFY: &str = "io.systemd.oom.Prekill.Notify";
/// A call is a few hundred bytes; more is not oomd.
const MAX_CALL: u64 = 64 << 10;

/// A call read from oomd (or anything else that connected).
#[derive(Debug, PartialEq)]
pub enum Call {
    /// The group about to be killed.
    Notify(String),
    /// A method this hook does not have.
    Other(String),
    /// Not a Varlink call, or Notify without its cgroup.
    Bad,
}

/// The listening socket, removed when memtrace ends.
pub struct Hook {
    pub listener: UnixListener,
    path: PathBuf,
}

impl Hook {
    pub fn listen(dir: &Path) -> std::io::Result<Hook> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("memtrace-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        listener.set_nonblocking(true)?;
        Ok(Hook { listener, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The calls waiting, each with its connection to reply on.
    pub fn calls(&self) -> Vec<(UnixStream, Call)> {
        let mut out = Vec::new();
        while let Ok((mut c, _)) = self.listener.accept() {
            // A caller that sends nothing holds no one up for long.
            let _ = c.set_nonblocking(false);
            let _ = c.set_read_timeout(Some(Duration::from_secs(1)));
            let mut msg = Vec::new();
            let mut byte = [0u8];
            let mut r = (&mut c).take(MAX_CALL);
            while r.read(&mut byte).is_ok_and(|n| n == 1) && byte[0] != 0 {
                msg.push(byte[0]);
            }
            let call = parse(&msg);
            out.push((c, call));
        }
        out
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

pub fn parse(msg: &[u8]) -> Call {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(msg) else {
        return Call::Bad;
    };
    match v["method"].as_str() {
        Some(NOTIFY) => match v["parameters"]["cgroup"].as_str() {
            Some(g) if !g.is_empty() => Call::Notify(g.to_string()),
            _ => Call::Bad,
        },
        Some(m) => Call::Other(m.to_string()),
        None => Call::Bad,
    }
}

/// The Varlink reply to `call`.
pub fn reply_to(call: &Call) -> serde_json::Value {
    match call {
        Call::Notify(_) => serde_json::json!({ "parameters": {} }),
        Call::Other(m) => serde_json::json!({
            "error": "org.varlink.service.MethodNotFound",
            "parameters": { "method": m },
        }),
        Call::Bad => serde_json::json!({
            "error": "org.varlink.service.InvalidParameter",
            "parameters": { "parameter": "cgroup" },
        }),
    }
}

pub fn reply(mut c: UnixStream, call: &Call) {
    let mut b = reply_to(call).to_string().into_bytes();
    b.push(0);
    // oomd may have given up waiting: nothing to do about it.
    let _ = c.write_all(&b);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_parse_as_oomd_sends_them() {
        let n = br#"{"method":"io.systemd.oom.Prekill.Notify","parameters":{"cgroup":"/system.slice/a.service"}}"#;
        assert_eq!(parse(n), Call::Notify("/system.slice/a.service".into()));
        assert_eq!(
            parse(br#"{"method":"org.varlink.service.GetInfo"}"#),
            Call::Other("org.varlink.service.GetInfo".into())
        );
        assert_eq!(parse(b"not json"), Call::Bad);
        assert_eq!(
            parse(br#"{"method":"io.systemd.oom.Prekill.Notify","parameters":{}}"#),
            Call::Bad
        );
        assert_eq!(
            reply_to(&Call::Notify("/a".into())).to_string(),
            r#"{"parameters":{}}"#
        );
    }
}
