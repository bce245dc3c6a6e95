//! `swapin`: swap-ins counted by process, in `faults`' values.

use crate::{faults::FaultVal, ProcKey};

crate::names! {
    maps {
        SWAPINS: ProcKey => FaultVal, OnDemand;
    }
    globals {}
    progs {
        SWAPIN_KPROBE = swapin_kprobe,
        SWAPIN_FENTRY = swapin_fentry,
    }
}
