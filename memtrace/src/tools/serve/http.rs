//! serve's HTTP: GET /metrics answers the text last rendered, by hyper's
//! HTTP/1.1 server on a tokio runtime of its own thread (a scrape never
//! waits on the event loop, nor the event loop on a client). Connections
//! are served concurrently, each with a deadline for its request headers
//! and one for the whole exchange (not per read), so a client sending a
//! byte a second, or a hundred idle ones, never holds up a scrape; past
//! `MAX_CONNECTIONS` a connection is answered 503 at once and closed.

use std::convert::Infallible;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE as CT};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;

/// OpenMetrics text, as prometheus-client encodes it.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Connections served at once: well above any number of scrapers and idle
/// connections a host sees, well below what would cost memtrace's memory.
const MAX_CONNECTIONS: usize = 256;

/// The request line and headers within this; the whole exchange, answer
/// written, within twice this.
const REQUEST_WITHIN: Duration = Duration::from_secs(5);

/// Serves `page` on `listener` until the process exits, from a thread
/// started now: call it after capabilities are dropped, which a thread
/// inherits from the one that starts it.
pub fn spawn(listener: TcpListener, page: Arc<Mutex<String>>) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    std::thread::Builder::new()
        .name("memtrace-http".into())
        .spawn(move || rt.block_on(accept(listener, page)))?;
    Ok(())
}

async fn accept(listener: TcpListener, page: Arc<Mutex<String>>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            say!("memtrace: serve: cannot serve HTTP: {e}");
            return;
        }
    };
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            // Out of descriptors, say: wait rather than spin.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            busy(stream);
            continue;
        };
        let page = page.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let answer = respond(&req, &page);
                async move { Ok::<_, Infallible>(answer) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(REQUEST_WITHIN)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(2 * REQUEST_WITHIN, conn).await;
            drop(slot);
        });
    }
}

/// Too many connections: 503 without waiting on the client.
fn busy(c: tokio::net::TcpStream) {
    let _ = c.try_write(
        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
}

fn respond(req: &Request<Incoming>, page: &Mutex<String>) -> Response<Full<Bytes>> {
    let (status, ctype, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => (StatusCode::OK, CONTENT_TYPE, page.lock().unwrap().clone()),
        (&Method::GET, "/") => (
            StatusCode::OK,
            "text/plain; charset=utf-8",
            "memtrace: metrics on /metrics\n".to_string(),
        ),
        (&Method::GET, _) => (StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        ),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(CT, HeaderValue::from_static(ctype));
    r
}
