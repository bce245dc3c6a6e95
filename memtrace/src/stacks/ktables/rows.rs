//! The shared row array (4-byte words) and which of its words are free:
//! files' slices are placed first-fit, and a file's slice goes back when no
//! live process's table refers to it (evicted to make room).

use std::os::fd::RawFd;

pub(super) struct Rows {
    to: Target,
    /// Free extents (first, n), sorted by first, never adjacent.
    free: Vec<(u32, u32)>,
}

/// Where rows are copied: the array map, mapped for each copy only (its
/// pages are kernel memory either way; mapped for the whole run, all 32 MiB
/// of them counted in memtrace's resident size), or the tests' memory.
enum Target {
    Map {
        fd: RawFd,
        page: usize,
    },
    #[cfg(test)]
    Memory(*mut u32),
}

// SAFETY: the test memory is owned by the test and written only through `&mut`.
unsafe impl Send for Rows {}

impl Rows {
    /// `fd` is a BPF_F_MMAPABLE array of `len` words, open while `Rows` is.
    pub(super) fn new(fd: RawFd, len: u32) -> Rows {
        Rows {
            to: Target::Map {
                fd,
                page: crate::kernel::btf::page_size() as usize,
            },
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
        if !self.copy(first, rows) {
            self.release(first, n);
            return None;
        }
        Some(first)
    }

    /// Copies `rows` to word `first` (inside the array: a free extent). The
    /// programs read rows only through slices published after this copy.
    fn copy(&mut self, first: u32, rows: &[u32]) -> bool {
        let (fd, page) = match self.to {
            Target::Map { fd, page } => (fd, page),
            #[cfg(test)]
            Target::Memory(p) => {
                // SAFETY: the test's memory holds every free extent.
                unsafe {
                    std::ptr::copy_nonoverlapping(rows.as_ptr(), p.add(first as usize), rows.len())
                };
                return true;
            }
        };
        let start = first as usize * 4;
        let off = start / page * page;
        let len = (start + rows.len() * 4).div_ceil(page) * page - off;
        // SAFETY: a shared mapping of the array's pages holding the extent.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                off as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return false;
        }
        // SAFETY: [start, start + 4 * n) lies in the mapped [off, off + len).
        unsafe {
            std::ptr::copy_nonoverlapping(
                rows.as_ptr(),
                p.cast::<u8>().add(start - off).cast::<u32>(),
                rows.len(),
            );
            libc::munmap(p, len);
        }
        true
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
            to: Target::Memory(mem.as_mut_ptr()),
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
        drop(r);
        drop(mem);
    }
}
