//! The shared row array (4-byte words), mapped into memtrace, and which of
//! its words are free: files' slices are placed first-fit, and a file's
//! slice goes back when no live process's table refers to it (evicted to
//! make room).

pub(super) struct Rows {
    ptr: *mut u32,
    bytes: usize,
    /// Free extents (first, n), sorted by first, never adjacent.
    free: Vec<(u32, u32)>,
}

// SAFETY: the mapping is owned by `Rows` and written only through `&mut`.
unsafe impl Send for Rows {}

impl Drop for Rows {
    fn drop(&mut self) {
        // SAFETY: mapped in `KTables::new` with this length.
        unsafe { libc::munmap(self.ptr.cast(), self.bytes) };
    }
}

impl Rows {
    /// # Safety
    /// `ptr` is a shared mapping of `bytes` bytes holding `len` words, owned
    /// from here on.
    pub(super) unsafe fn new(ptr: *mut u32, len: u32, bytes: usize) -> Rows {
        Rows {
            ptr,
            bytes,
            free: if len > 0 { vec![(0, len)] } else { Vec::new() },
        }
    }

    /// Rows not in any slice.
    #[cfg(test)]
    fn free_rows(&self) -> u64 {
        self.free.iter().map(|&(_, n)| n as u64).sum()
    }

    /// Copies `rows` into the first free extent that holds them; None when
    /// none does.
    pub(super) fn place(&mut self, rows: &[u32]) -> Option<u32> {
        let n = u32::try_from(rows.len()).ok()?;
        let i = self.free.iter().position(|&(_, len)| len >= n)?;
        let (first, len) = self.free[i];
        if len == n {
            self.free.remove(i);
        } else {
            self.free[i] = (first + n, len - n);
        }
        // SAFETY: [first, first + n) is inside the mapping (a free extent);
        // the programs read rows only through slices published after this
        // copy.
        unsafe {
            std::ptr::copy_nonoverlapping(rows.as_ptr(), self.ptr.add(first as usize), rows.len())
        };
        Some(first)
    }

    /// Gives back `[first, first + n)`, merged with free neighbours.
    pub(super) fn release(&mut self, first: u32, n: u32) {
        if n == 0 {
            return;
        }
        let i = self.free.partition_point(|&(f, _)| f < first);
        self.free.insert(i, (first, n));
        // With the next, then with the previous.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(len: u32) -> (Rows, Vec<u32>) {
        let mut mem = vec![0u32; len as usize];
        let r = Rows {
            ptr: mem.as_mut_ptr(),
            bytes: 0,
            free: vec![(0, len)],
        };
        (r, mem)
    }

    #[test]
    fn released_rows_are_placed_again_and_merge_with_their_neighbours() {
        let (mut r, mem) = rows(100);
        let a = r.place(&[0u32; 40]).unwrap();
        let b = r.place(&[0u32; 40]).unwrap();
        assert_eq!((a, b), (0, 40));
        assert!(r.place(&[0u32; 30]).is_none());
        r.release(a, 40);
        r.release(b, 40);
        // One extent again: the whole array.
        assert_eq!(r.free, vec![(0, 100)]);
        assert_eq!(r.place(&[0u32; 100]), Some(0));
        assert_eq!(r.free_rows(), 0);
        // Not unmapped: the test owns the memory.
        std::mem::forget(r);
        drop(mem);
    }
}
