//! Build ids of the modules in recorded stacks, so a record read on another
//! machine says which build of each binary its frames came from. The
//! symbolizer names the files it opens here while a run records.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

static ON: AtomicBool = AtomicBool::new(false);
static FILES: Mutex<Option<HashMap<String, Arc<File>>>> = Mutex::new(None);

/// Turns on the bookkeeping (only runs that record pay for it).
pub fn enable() {
    ON.store(true, Ordering::Relaxed);
}

/// The symbolizer opened `path` (a mapped executable file).
pub fn saw(path: &str, f: &Arc<File>) {
    if !ON.load(Ordering::Relaxed) {
        return;
    }
    let name = path.rsplit('/').next().unwrap_or(path).to_string();
    let mut g = FILES.lock().unwrap();
    g.get_or_insert_with(HashMap::new)
        .entry(name)
        .or_insert_with(|| f.clone());
}

/// The GNU build id of module `name` as hex, if its file was seen and has one.
pub fn of(name: &str) -> Option<String> {
    let f = FILES.lock().unwrap().as_ref()?.get(name)?.clone();
    let mut data = Vec::new();
    // Through /proc/self/fd: the file stays readable after its process
    // exited or it was replaced on disk.
    File::open(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&*f)
    ))
    .ok()?
    .read_to_end(&mut data)
    .ok()?;
    hex_build_id(&data)
}

pub fn hex_build_id(elf: &[u8]) -> Option<String> {
    use object::Object;
    let obj = object::File::parse(elf).ok()?;
    let id = obj.build_id().ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_build_id_of_a_system_binary() {
        // What `readelf -n` says, where the binary has one.
        let Ok(elf) = std::fs::read("/usr/bin/ls") else {
            return;
        };
        let id = super::hex_build_id(&elf).expect("ls has a build id");
        let readelf = std::process::Command::new("readelf")
            .args(["-n", "/usr/bin/ls"])
            .output();
        if let Ok(o) = readelf {
            let text = String::from_utf8_lossy(&o.stdout);
            assert!(text.contains(&format!("Build ID: {id}")), "{id} {text}");
        }
        assert_eq!(super::hex_build_id(b"not an elf"), None);
    }
}
