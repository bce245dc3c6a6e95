//! A session with the stack machinery beside it: the symbolizer, the
//! unwinder, the walked stacks kept, and the group each reported process
//! was in. The session below loads, attaches and reads maps and knows
//! nothing of stacks; the tools and the run hold this.

use std::ops::{Deref, DerefMut};

use super::store::StackStore;
use super::symbolize::Symbolizer;
use super::unwind::DwarfStacks;
use crate::session::Session;

pub struct Traced {
    pub session: Session,
    pub sym: Symbolizer,
    /// `--stack-mode dwarf`: the unwinder and the unwound samples.
    pub dwarf: Option<DwarfStacks>,
    /// User stack ids name USTACKS entries (walked in the program), not STACKS.
    pub walked_user_stacks: bool,
    /// Walked user stacks taken out of USTACKS (`harvest_user_stacks`).
    pub stacks: StackStore,
    /// The group of each process a stack is reported for.
    pub groups: crate::process::groups::Groups,
    /// The processes behind each stack counted by image.
    pub members: super::members::Members,
    /// When walked stacks were last taken out of USTACKS.
    pub(super) harvested: std::time::Instant,
}

impl Traced {
    pub fn new(session: Session) -> Traced {
        Traced {
            session,
            sym: Symbolizer::new(),
            dwarf: None,
            walked_user_stacks: false,
            stacks: StackStore::new(),
            groups: Default::default(),
            members: Default::default(),
            harvested: std::time::Instant::now(),
        }
    }

    /// The session's losses with the stacks' own: report lines whose walked
    /// stack had been let go.
    pub fn losses(&self) -> Vec<(&'static str, u64)> {
        let mut out = self.session.losses();
        // Before map_read_fail, the session's last, as the summary lists them.
        let at = out.len().saturating_sub(1);
        out.insert(at, ("stack_evicted", self.stacks.missed.get()));
        out
    }
}

impl Deref for Traced {
    type Target = Session;
    fn deref(&self) -> &Session {
        &self.session
    }
}

impl DerefMut for Traced {
    fn deref_mut(&mut self) -> &mut Session {
        &mut self.session
    }
}
