//! How faults' counts by (process, stack) fold under the shared bound on
//! kept counts (`crate::stacks::kept`): by mode, the page and kernel stack dropped.

use memtrace_common::{faults::FaultKey, stacks::USTACK_FOLDED};

use crate::stacks::kept::StackKeyed;

pub type Kept = crate::stacks::kept::Kept<FaultKey, (u64, String)>;

impl StackKeyed for FaultKey {
    fn tgid(&self) -> u32 {
        self.tgid
    }
    fn walked(&self) -> Option<(u32, u32)> {
        (self.ustack >= 0).then_some((self.ustack as u32, self.ustack_check as u32))
    }
    fn folded(&self) -> Option<Self> {
        (self.ustack != USTACK_FOLDED && (self.ustack >= 0 || self.kstack >= 0)).then_some(
            FaultKey {
                tgid: self.tgid,
                kernel_mode: self.kernel_mode,
                ustack: USTACK_FOLDED,
                kstack: -1,
                ..Default::default()
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stack_folds_by_process_and_mode_and_a_count_by_process_stays() {
        let k = FaultKey {
            tgid: 3,
            kernel_mode: 1,
            ustack_check: 9,
            ustack: 12,
            kstack: 40,
            page: 0x1000,
            gen: 1,
        };
        let f = k.folded().unwrap();
        assert_eq!(
            (f.tgid, f.kernel_mode, f.ustack, f.kstack),
            (3, 1, USTACK_FOLDED, -1)
        );
        assert_eq!((f.ustack_check, f.page), (0, 0));
        assert_eq!(f.folded(), None);
        let by_process = FaultKey {
            tgid: 3,
            ustack: -1,
            kstack: -1,
            ..Default::default()
        };
        assert_eq!(by_process.folded(), None);
    }
}
