//! The smallest HTTP/1.1 responder that serves one page: GET /metrics
//! answers the text last rendered, one request per connection. Each
//! connection has a thread of its own and a deadline for its whole request
//! (not per read), so a client sending a byte a second, or a hundred idle
//! ones, never holds up a scrape; past `MAX_CONNECTIONS` a connection is
//! answered 503 at once and closed.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// OpenMetrics text, as prometheus-client encodes it.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Connections served at once (each a thread with a small stack): well
/// above any number of scrapers and idle connections a host sees, well
/// below what would cost memtrace's memory.
const MAX_CONNECTIONS: usize = 256;

/// The whole request (line and headers) within this, and the answer
/// written within this again.
const REQUEST_WITHIN: Duration = Duration::from_secs(5);

/// Serves `page` on `listener` until the process exits.
pub fn spawn(listener: TcpListener, page: Arc<Mutex<String>>) {
    let live = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            match conn {
                Ok(c) if live.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS => {
                    live.fetch_sub(1, Ordering::AcqRel);
                    busy(c);
                }
                Ok(c) => {
                    let (page, mine) = (page.clone(), live.clone());
                    let spawned = std::thread::Builder::new()
                        .name("memtrace-http".into())
                        .stack_size(64 << 10)
                        .spawn(move || {
                            let _ = answer(c, &page);
                            mine.fetch_sub(1, Ordering::AcqRel);
                        });
                    if spawned.is_err() {
                        live.fetch_sub(1, Ordering::AcqRel);
                    }
                }
                // Out of descriptors, say: wait rather than spin.
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    });
}

/// Too many connections: 503 without waiting on the client.
fn busy(mut c: TcpStream) {
    let _ = c.set_nonblocking(true);
    let _ = c.write_all(
        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
}

fn answer(mut c: TcpStream, page: &Mutex<String>) -> std::io::Result<()> {
    let deadline = Instant::now() + REQUEST_WITHIN;
    c.set_write_timeout(Some(REQUEST_WITHIN))?;
    // The request line and headers; a body, if any, is not read.
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        c.set_read_timeout(Some(left))?;
        let n = c.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf);
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET", "/metrics") => ("200 OK", CONTENT_TYPE, page.lock().unwrap().clone()),
        ("GET", "/") => (
            "200 OK",
            "text/plain; charset=utf-8",
            "memtrace: metrics on /metrics\n".to_string(),
        ),
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n".to_string(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes())?;
    c.write_all(body.as_bytes())?;
    c.flush()
}
