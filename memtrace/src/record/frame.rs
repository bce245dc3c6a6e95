//! Each item after the header framed as a CBOR array of two, its CRC-32
//! and its encoding as a byte string: still a CBOR sequence, but damage in
//! the middle of a file is told apart from a file cut short at its end, and
//! an item is read only as far as the file's bytes go (a length the file
//! does not have is never allocated). CBOR heads are written and parsed
//! here (RFC 8949 3.1): five lines, where a CBOR library would want the
//! whole item in memory twice to frame it.

use std::io::{BufRead, Read};

const ARRAY_OF_TWO: u8 = 0x82;
const UINT: u8 = 0;
const BYTES: u8 = 2;

/// The head of a CBOR data item of `major` type with argument `v`.
fn head(major: u8, v: u64, out: &mut Vec<u8>) {
    let m = major << 5;
    match v {
        0..=23 => out.push(m | v as u8),
        24..=0xff => out.extend([m | 24, v as u8]),
        0x100..=0xffff => {
            out.push(m | 25);
            out.extend((v as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(m | 26);
            out.extend((v as u32).to_be_bytes());
        }
        _ => {
            out.push(m | 27);
            out.extend(v.to_be_bytes());
        }
    }
}

/// `item` (its CBOR encoding) framed.
pub fn framed(item: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(item.len() + 16);
    out.push(ARRAY_OF_TWO);
    head(UINT, crc32fast::hash(item) as u64, &mut out);
    head(BYTES, item.len() as u64, &mut out);
    out.extend_from_slice(item);
    out
}

/// What comes next in a file of framed items.
#[derive(Debug, PartialEq)]
pub enum Next {
    /// The file ends between two items.
    End,
    Item(Vec<u8>),
    /// The file ends inside an item: the run was cut short.
    Cut,
    /// Bytes that are no frame, or a frame whose checksum does not match.
    Damaged(String),
}

/// Reads one byte, None at the end of the file.
fn byte(r: &mut impl Read) -> Option<u8> {
    let mut b = [0u8];
    r.read_exact(&mut b).ok().map(|()| b[0])
}

/// A head's (major type, argument); None when the file ends inside it.
fn read_head(r: &mut impl Read) -> Option<Result<(u8, u64), ()>> {
    let first = byte(r)?;
    let (major, info) = (first >> 5, first & 0x1f);
    let n = match info {
        0..=23 => return Some(Ok((major, info as u64))),
        24 => 1,
        25 => 2,
        26 => 4,
        27 => 8,
        _ => return Some(Err(())),
    };
    let mut v = 0u64;
    for _ in 0..n {
        v = v << 8 | byte(r)? as u64;
    }
    Some(Ok((major, v)))
}

/// The next frame; `at` is its offset past the header, advanced past it.
pub fn next(r: &mut impl BufRead, at: &mut u64) -> Next {
    let start = *at;
    if r.fill_buf().map(|b| b.is_empty()).unwrap_or(true) {
        return Next::End;
    }
    let mut counted = CountingReader { inner: r, n: 0 };
    let what = read_frame(&mut counted);
    *at = start + counted.n;
    match what {
        Frame::Whole(item, crc) if crc32fast::hash(&item) as u64 == crc => Next::Item(item),
        Frame::Whole(..) => Next::Damaged(format!(
            "the item at byte {start} after the header is damaged (its checksum does not match)"
        )),
        Frame::Cut => Next::Cut,
        Frame::NotOne => Next::Damaged(format!(
            "the bytes at {start} after the header are not an item (damaged)"
        )),
    }
}

enum Frame {
    Whole(Vec<u8>, u64),
    Cut,
    NotOne,
}

fn read_frame(r: &mut impl Read) -> Frame {
    match byte(r) {
        Some(ARRAY_OF_TWO) => {}
        Some(_) => return Frame::NotOne,
        None => return Frame::Cut,
    }
    let crc = match read_head(r) {
        None => return Frame::Cut,
        Some(Ok((UINT, crc))) => crc,
        Some(_) => return Frame::NotOne,
    };
    let len = match read_head(r) {
        None => return Frame::Cut,
        Some(Ok((BYTES, len))) => len,
        Some(_) => return Frame::NotOne,
    };
    // Grown as bytes arrive, never to a length the file does not have.
    let mut item = Vec::new();
    match r.take(len).read_to_end(&mut item) {
        Ok(n) if n as u64 == len => Frame::Whole(item, crc),
        _ => Frame::Cut,
    }
}

struct CountingReader<'a, R> {
    inner: &'a mut R,
    n: u64,
}

impl<R: Read> Read for CountingReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.n += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_cbor_s() {
        // RFC 8949 appendix A: 24 -> 0x18 0x18, 1000 -> 0x19 0x03 0xe8,
        // h'01020304' -> 0x44 01020304.
        let mut out = Vec::new();
        head(UINT, 24, &mut out);
        head(UINT, 1000, &mut out);
        head(BYTES, 4, &mut out);
        assert_eq!(out, [0x18, 0x18, 0x19, 0x03, 0xe8, 0x44]);
    }

    #[test]
    fn a_frame_reads_back_cut_or_damaged() {
        let item = vec![7u8; 300];
        let f = framed(&item);
        let mut at = 0;
        assert_eq!(next(&mut &f[..], &mut at), Next::Item(item.clone()));
        assert_eq!(at, f.len() as u64);
        for cut in 1..f.len() {
            assert_eq!(next(&mut &f[..cut], &mut 0), Next::Cut, "cut at {cut}");
        }
        let mut bad = f.clone();
        bad[f.len() - 10] ^= 1;
        assert!(matches!(next(&mut &bad[..], &mut 0), Next::Damaged(m) if m.contains("checksum")));
        assert_eq!(next(&mut &b""[..], &mut 0), Next::End);
    }
}
