//! From version 3 the items after the header are one gzip stream, flushed
//! at the end of each item (a sync flush: what was written decodes without
//! what follows). A file cut short still reads to its last whole item; the
//! frames each interval repeats cost a few bytes. The header stays plain
//! CBOR, so `file(1)` and the version check read it as before.

use std::io::{BufRead, Read, Write};

use flate2::write::GzEncoder;

use super::format::{write_item, Item};

/// The writing side: items compressed as they are written.
pub struct Items<W: Write>(GzEncoder<W>);

impl<W: Write> Items<W> {
    pub fn new(w: W) -> Self {
        Items(GzEncoder::new(w, flate2::Compression::default()))
    }

    /// One item, flushed through to `W`.
    pub fn write(&mut self, item: &Item) -> std::io::Result<()> {
        write_item(&mut self.0, item)
    }

    /// The stream's end (after the trailer): a reader sees it whole.
    pub fn finish(&mut self) -> std::io::Result<()> {
        self.0.try_finish()
    }
}

/// Bytes a byte of the file may inflate to (and a floor, for small
/// files): records memtrace writes come to 20 to 30, and a long run of
/// identical reports to about 130 at most (deflate's longest match is 258
/// bytes for 2 or 3); a stream that makes far more is no record (a few
/// bytes of zeros can inflate a thousandfold), and would be held in memory.
pub const MAX_RATIO: u64 = 256;
pub const FLOOR: u64 = 64 << 20;

/// The file's bytes the decoder has taken.
struct Taken<R> {
    inner: R,
    n: u64,
}

impl<R: Read> Read for Taken<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.n += n as u64;
        Ok(n)
    }
}

impl<R: BufRead> BufRead for Taken<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.inner.fill_buf()
    }
    fn consume(&mut self, n: usize) {
        self.n += n as u64;
        self.inner.consume(n)
    }
}

/// The reading side. A stream that is corrupt (not one cut short), or
/// that inflates past MAX_RATIO, is kept as damage: the frame reader sees
/// any failed read as the file's end.
pub struct Inflated<R: BufRead> {
    gz: flate2::bufread::GzDecoder<Taken<R>>,
    out: u64,
    pub damage: Option<String>,
}

impl<R: BufRead> Inflated<R> {
    pub fn new(r: R) -> Self {
        Inflated {
            gz: flate2::bufread::GzDecoder::new(Taken { inner: r, n: 0 }),
            out: 0,
            damage: None,
        }
    }
}

impl<R: BufRead> Read for Inflated<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.damage.is_some() {
            return Err(std::io::Error::other("damaged"));
        }
        let r = self.gz.read(buf);
        match &r {
            Err(e) if e.kind() != std::io::ErrorKind::UnexpectedEof => {
                self.damage = Some(e.to_string());
            }
            Ok(n) => {
                self.out += *n as u64;
                let taken = self.gz.get_ref().n;
                if self.out > taken.saturating_mul(MAX_RATIO).saturating_add(FLOOR) {
                    self.damage = Some(format!(
                        "they inflate to more than {MAX_RATIO} times their size, which no record memtrace writes does"
                    ));
                    return Err(std::io::Error::other("inflates too far"));
                }
            }
            _ => {}
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn a_stream_that_inflates_too_far_is_damage_not_memory() {
        // Zeros inflate about a thousandfold.
        let bomb = gz(&vec![0u8; (2 * FLOOR) as usize]);
        let mut r = Inflated::new(&bomb[..]);
        let mut sink = [0u8; 1 << 16];
        let mut out = 0u64;
        while let Ok(n @ 1..) = r.read(&mut sink) {
            out += n as u64;
        }
        assert!(r.damage.unwrap().contains("more than 256 times"));
        assert!(out <= FLOOR + MAX_RATIO * bomb.len() as u64 + sink.len() as u64);
    }

    #[test]
    fn a_corrupt_stream_is_damage_and_a_cut_one_is_not() {
        let data: Vec<u8> = (0..20_000u32).flat_map(|i| (i * 7).to_le_bytes()).collect();
        let z = gz(&data);
        let read = |b: &[u8]| {
            let mut r = Inflated::new(b);
            let mut out = Vec::new();
            let _ = r.read_to_end(&mut out);
            (out, r.damage)
        };
        assert_eq!(read(&z), (data.clone(), None));
        let (cut, damage) = read(&z[..z.len() / 2]);
        assert!(damage.is_none() && !cut.is_empty() && data.starts_with(&cut));
        let mut bad = z.clone();
        bad[z.len() / 2] ^= 0xff;
        assert!(read(&bad).1.is_some());
    }
}
