//! The smallest HTTP/1.1 responder that serves one page: GET /metrics
//! answers the text last rendered, one request per connection. A thread of
//! its own, so a slow scraper never holds up the event loop; timeouts, so
//! it never holds up the next scraper for long.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// OpenMetrics text, as prometheus-client encodes it.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `page` on `listener` until the process exits.
pub fn spawn(listener: TcpListener, page: Arc<Mutex<String>>) {
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            match conn {
                Ok(c) => {
                    let _ = answer(c, &page);
                }
                // Out of descriptors, say: wait rather than spin.
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    });
}

fn answer(mut c: TcpStream, page: &Mutex<String>) -> std::io::Result<()> {
    c.set_read_timeout(Some(Duration::from_secs(2)))?;
    c.set_write_timeout(Some(Duration::from_secs(5)))?;
    // The request line and headers; a body, if any, is not read.
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
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
