//! `--otlp-push URL`: the OTLP profiles POSTed to an OTLP/HTTP receiver
//! (the Collector's port 4318, Pyroscope's), as OTLP/HTTP has it: the
//! protobuf body, `Content-Type: application/x-protobuf`, to
//! `/v1development/profiles` unless the URL names a path. One HTTP/1.1
//! request by hyper's client (the crate `serve` answers with), on a
//! runtime of its own thread: it may be called from within the event
//! loop's. https endpoints are refused at start with the way round (the
//! file, sent with curl): TLS would bring a TLS stack for one POST.

use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{CONTENT_TYPE, HOST, USER_AGENT};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;

use crate::error::{Error, Result};

/// The receiver's default port (OTLP/HTTP) and path (profiles, alpha).
const PORT: u16 = 4318;
const PATH: &str = "/v1development/profiles";
const TIMEOUT: Duration = Duration::from_secs(10);

/// Why a push did not get a 2xx.
#[derive(Debug, thiserror::Error)]
enum PushError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("{0}")]
    Request(#[from] hyper::http::Error),
    #[error("no reply within {} s", TIMEOUT.as_secs())]
    Timeout,
    #[error("the request's thread panicked")]
    Panicked,
    #[error("HTTP/1.1 {} {}", .0.as_u16(), .0.canonical_reason().unwrap_or(""))]
    Status(StatusCode),
}

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
    let body = Bytes::copy_from_slice(body);
    let sent = std::thread::scope(|sc| {
        sc.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .enable_time()
                .build()?;
            rt.block_on(async {
                match tokio::time::timeout(TIMEOUT, post(to, body)).await {
                    Ok(r) => r,
                    Err(_) => Err(PushError::Timeout),
                }
            })
        })
        .join()
        .unwrap_or(Err(PushError::Panicked))
    });
    match sent.map_err(|e| fail(e.to_string()))? {
        s if s.is_success() => Ok(()),
        s => Err(fail(PushError::Status(s).to_string())),
    }
}

async fn post(to: &Endpoint, body: Bytes) -> std::result::Result<StatusCode, PushError> {
    let tcp = tokio::net::TcpStream::connect((to.host.as_str(), to.port)).await?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    let conn = tokio::spawn(conn);
    let req = Request::post(&to.path)
        .header(HOST, format!("{}:{}", to.host, to.port))
        .header(CONTENT_TYPE, "application/x-protobuf")
        .header(USER_AGENT, concat!("memtrace/", env!("CARGO_PKG_VERSION")))
        .body(Full::new(body))?;
    let status = send.send_request(req).await?.status();
    conn.abort();
    Ok(status)
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
