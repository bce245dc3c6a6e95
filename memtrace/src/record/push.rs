//! `--otlp-push URL`: the OTLP profiles POSTed to an OTLP/HTTP receiver
//! (the Collector's port 4318, Pyroscope's), as OTLP/HTTP has it: the
//! protobuf body, `Content-Type: application/x-protobuf`, to
//! `/v1development/profiles` unless the URL names a path. One plain
//! HTTP/1.1 request over TCP, written here: a client crate would bring an
//! async stack and TLS for one POST. https endpoints are refused at start
//! with the way round (the file, sent with curl).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::error::{Error, Result};

/// The receiver's default port (OTLP/HTTP) and path (profiles, alpha).
const PORT: u16 = 4318;
const PATH: &str = "/v1development/profiles";
const TIMEOUT: Duration = Duration::from_secs(10);

/// Where to send: host and port, and the request path.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub path: String,
}

/// `http://HOST[:PORT][/PATH]`, checked when the command line is read.
pub fn parse_url(url: &str) -> std::result::Result<Endpoint, String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        format!(
            "'{url}' is not an http:// URL (for https, write --otlp FILE and send it with curl)"
        )
    })?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h, p.parse().map_err(|_| format!("'{p}' is not a port"))?),
        None => (authority, PORT),
    };
    if host.is_empty() {
        return Err(format!("'{url}' names no host"));
    }
    let path = match path {
        "" | "/" => PATH.to_string(),
        p => p.to_string(),
    };
    Ok(Endpoint {
        host: host.to_string(),
        port,
        path,
    })
}

/// POSTs `body`; an error unless the receiver answers 2xx.
pub fn push(to: &Endpoint, body: &[u8]) -> Result<()> {
    let url = format!("http://{}:{}{}", to.host, to.port, to.path);
    let fail = |what: String| Error::Runtime(format!("OTLP push to {url}: {what}"));
    let addr = (to.host.as_str(), to.port)
        .to_socket_addrs()
        .map_err(|e| fail(e.to_string()))?
        .next()
        .ok_or_else(|| fail("no address".into()))?;
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| fail(e.to_string()))?;
    let _ = s.set_read_timeout(Some(TIMEOUT));
    let _ = s.set_write_timeout(Some(TIMEOUT));
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/x-protobuf\r\n\
         Content-Length: {}\r\nUser-Agent: memtrace/{}\r\nConnection: close\r\n\r\n",
        to.path,
        to.host,
        to.port,
        body.len(),
        env!("CARGO_PKG_VERSION")
    );
    s.write_all(head.as_bytes())
        .and_then(|()| s.write_all(body))
        .map_err(|e| fail(e.to_string()))?;
    // The status line is all that is read.
    let mut reply = Vec::new();
    let _ = (&mut s).take(512).read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply);
    let status = reply.lines().next().unwrap_or("");
    match status
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
    {
        Some(200..=299) => Ok(()),
        Some(_) => Err(fail(status.trim().to_string())),
        None => Err(fail("no HTTP reply".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_host_port_and_path() {
        let e = parse_url("http://collector:4318").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.path.as_str()),
            ("collector", 4318, PATH)
        );
        let e = parse_url("http://127.0.0.1:9/ingest/otlp").unwrap();
        assert_eq!((e.port, e.path.as_str()), (9, "/ingest/otlp"));
        assert_eq!(parse_url("http://pyro/").unwrap().port, PORT);
        assert!(parse_url("https://x").unwrap_err().contains("curl"));
        assert!(parse_url("http://:80").is_err());
        assert!(parse_url("http://h:port").is_err());
    }
}
