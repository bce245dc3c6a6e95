//! The writer every printer writes through. It keeps the first write error,
//! so that the session ends on it (a closed pipe quietly, anything else as an
//! error) rather than tracing on into a pipe nobody reads or a full disk.

use std::fmt;
use std::io::{self, Write};

pub struct Sink {
    out: Box<dyn Write>,
    error: Option<io::Error>,
}

impl Sink {
    pub fn new(out: Box<dyn Write>) -> Self {
        Sink { out, error: None }
    }

    /// Writes all of `b`, unless an earlier write failed: output with a hole
    /// in it would read as complete.
    pub fn put(&mut self, b: &[u8]) {
        if self.error.is_none() {
            if let Err(e) = self.out.write_all(b) {
                self.error = Some(e);
            }
        }
    }

    pub fn put_fmt(&mut self, args: fmt::Arguments) {
        if self.error.is_none() {
            if let Err(e) = self.out.write_fmt(args) {
                self.error = Some(e);
            }
        }
    }

    pub fn flush(&mut self) {
        if self.error.is_none() {
            if let Err(e) = self.out.flush() {
                self.error = Some(e);
            }
        }
    }

    /// The first write error, if any.
    pub fn error(&self) -> Option<&io::Error> {
        self.error.as_ref()
    }
}

/// `writeln!` into a `Sink`: the error is kept by the sink, not returned.
macro_rules! putln {
    ($sink:expr) => {
        $sink.put(b"\n")
    };
    ($sink:expr, $($arg:tt)*) => {
        $sink.put_fmt(format_args!("{}\n", format_args!($($arg)*)))
    };
}
pub(crate) use putln;

static MUTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `f` with diagnostics held back: `doctor` attaches tools to see how they
/// attach, and what they would say to a user is in its table instead.
pub fn muted<T>(f: impl FnOnce() -> T) -> T {
    use std::sync::atomic::Ordering::Relaxed;
    let was = MUTED.swap(true, Relaxed);
    let r = f();
    MUTED.store(was, Relaxed);
    r
}

/// One line of diagnostics on stderr. Unlike `eprintln!` this does not panic
/// when stderr is a closed pipe (`memtrace ... 2>&1 | head -1`) or fails:
/// there is nowhere left to report that, and the run's output is stdout's.
pub fn to_stderr(args: fmt::Arguments) {
    if MUTED.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let mut e = io::stderr().lock();
    if e.write_fmt(args).is_ok() {
        // A failure here has nowhere to go either.
        e.write_all(b"\n").ok();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// /dev/full: every write fails with ENOSPC; counts the attempts.
    struct Full(Rc<Cell<usize>>);
    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            self.0.set(self.0.get() + 1);
            Err(io::Error::from_raw_os_error(libc::ENOSPC))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn keeps_the_first_error_and_stops_writing() {
        let tries = Rc::new(Cell::new(0));
        let mut s = Sink::new(Box::new(Full(tries.clone())));
        assert!(s.error().is_none());
        putln!(s, "a {}", 1);
        putln!(s, "b");
        s.put(b"c");
        s.flush();
        let e = s.error().expect("error kept");
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        assert_eq!(tries.get(), 1, "wrote on after the first error");
    }
}
