//! What the kernel programs send: ring-buffer records and fixed-size
//! strings (task names), decoded.

use aya::Pod;
use memtrace_common::TASK_COMM_LEN;

/// A C string from a fixed-size kernel buffer.
pub fn comm(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// The command name of per-CPU values: the first CPU's that has one.
pub fn first_comm<'a>(comms: impl IntoIterator<Item = &'a [u8; TASK_COMM_LEN]>) -> String {
    comms
        .into_iter()
        .map(|c| comm(c))
        .find(|c| !c.is_empty())
        .unwrap_or_default()
}

/// The kind of a record (its first field, as in every record); None for
/// data too short to have one.
pub fn kind_of(data: &[u8]) -> Option<u32> {
    data.get(..4)
        .map(|k| u32::from_ne_bytes([k[0], k[1], k[2], k[3]]))
}

/// Reads a record of `kind` (its first field, as in every record) from
/// ring-buffer bytes; None for other kinds or short data.
pub fn record<T: Pod>(data: &[u8], kind: u32) -> Option<T> {
    if data.len() < std::mem::size_of::<T>() || data[..4] != kind.to_ne_bytes() {
        return None;
    }
    // SAFETY: length checked; T is Pod, so any bytes make a valid T.
    Some(unsafe { std::ptr::read_unaligned(data.as_ptr() as *const T) })
}
