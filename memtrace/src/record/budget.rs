//! A bound on the memory a record takes to read: each list element decoded
//! is charged its size in memory, and the charges may not pass 16 times
//! the bytes read so far (and a floor), so a file of tiny items (an empty
//! frame is 4 bytes in the file and 96 in memory) is refused early, where
//! it once took 779 MiB for 62 MB. Files memtrace writes decode to at most
//! about 8 times their bytes (frames of `[unknown]`, table cells).

use std::cell::Cell;
use std::collections::BTreeMap;
use std::io::Read;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, Error, MapAccess, SeqAccess, Visitor};

/// Bytes of memory allowed per byte of file read.
pub const PER_BYTE: u64 = 16;
/// And a floor, for small files.
pub const FLOOR: u64 = 16 << 20;

thread_local! {
    static SPENT: Cell<u64> = const { Cell::new(0) };
    static READ: Cell<u64> = const { Cell::new(0) };
}

/// A new file: nothing read or spent yet on this thread.
pub fn start() {
    SPENT.with(|s| s.set(0));
    READ.with(|r| r.set(0));
}

/// A reader whose bytes count toward the allowance as they are decoded.
pub struct Counted<R>(pub R);

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.0.read(buf)?;
        READ.with(|r| r.set(r.get() + n as u64));
        Ok(n)
    }
}

/// Charges `n` bytes; an error once they pass the allowance.
fn charge<E: Error>(n: usize) -> Result<(), E> {
    let spent = SPENT.with(|s| {
        s.set(s.get().saturating_add(n as u64));
        s.get()
    });
    let allowed = READ.with(|r| r.get().saturating_mul(PER_BYTE).saturating_add(FLOOR));
    match spent <= allowed {
        true => Ok(()),
        false => Err(E::custom(format!(
            "it decodes to more than {PER_BYTE} bytes of memory per byte of file, \
             which no record memtrace writes does"
        ))),
    }
}

/// A list whose elements are charged as they are decoded: for
/// `#[serde(deserialize_with = "budget::list")]`.
pub fn list<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct V<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::new();
            loop {
                charge(std::mem::size_of::<T>())?;
                match seq.next_element()? {
                    Some(x) => out.push(x),
                    None => return Ok(out),
                }
            }
        }
    }
    d.deserialize_seq(V(PhantomData))
}

/// A map whose entries are charged as they are decoded (a B-tree entry
/// costs about twice its key and value).
pub fn map<'de, D, K, V>(d: D) -> Result<BTreeMap<K, V>, D::Error>
where
    D: Deserializer<'de>,
    K: Deserialize<'de> + Ord,
    V: Deserialize<'de>,
{
    struct M<K, V>(PhantomData<(K, V)>);
    impl<'de, K: Deserialize<'de> + Ord, V: Deserialize<'de>> Visitor<'de> for M<K, V> {
        type Value = BTreeMap<K, V>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            loop {
                charge(2 * std::mem::size_of::<(K, V)>())?;
                match m.next_entry()? {
                    Some((k, v)) => out.insert(k, v),
                    None => return Ok(out),
                };
            }
        }
    }
    d.deserialize_map(M(PhantomData))
}

/// A list of lists (a table's rows), both levels charged.
pub fn lists<'de, D, T>(d: D) -> Result<Vec<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Row<T>(Vec<T>);
    impl<'de, T: Deserialize<'de>> Deserialize<'de> for Row<T> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            list(d).map(Row)
        }
    }
    list::<D, Row<T>>(d).map(|rows| rows.into_iter().map(|r| r.0).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Frames {
        #[serde(deserialize_with = "list")]
        f: Vec<u64>,
    }

    fn decode(n: usize) -> Result<Frames, ciborium::de::Error<std::io::Error>> {
        let mut buf = Vec::new();
        let v: Vec<u64> = vec![1; n];
        ciborium::into_writer(&serde_json::json!({ "f": v }), &mut buf).unwrap();
        start();
        ciborium::from_reader::<Frames, _>(Counted(&buf[..]))
    }

    #[test]
    fn lists_at_half_the_allowance_decode_whole() {
        // Small u64s are 1 byte in the file and 8 in memory: half of 16,
        // as the files memtrace writes are at most. Ten million of them
        // (80 MB charged) read to the end.
        assert_eq!(decode(10_000_000).unwrap().f.len(), 10_000_000);
    }

    #[test]
    fn tiny_items_are_refused_once_past_the_floor() {
        // Empty lists: 1 byte in the file, 24 bytes (a Vec) in memory.
        #[derive(serde::Deserialize)]
        struct Rows {
            #[serde(deserialize_with = "lists")]
            r: Vec<Vec<u8>>,
        }
        let mut buf = Vec::new();
        let v: Vec<Vec<u8>> = vec![vec![]; 2_000_000];
        ciborium::into_writer(&serde_json::json!({ "r": v }), &mut buf).unwrap();
        start();
        let e = ciborium::from_reader::<Rows, _>(Counted(&buf[..])).map(|r| r.r.len());
        assert!(format!("{e:?}").contains("per byte of file"), "{e:?}");
        // Past the floor by little: it stopped near 16 MiB of charges,
        // about 2 MB into the file, not at its end.
        let read = READ.with(|r| r.get());
        assert!(read < 2_000_000, "{read}");
    }
}
