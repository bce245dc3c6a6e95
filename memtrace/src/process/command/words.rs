//! Which program a `-c` command runs: plain words the shell can exec, and
//! the file its first word names.

/// Whether `cmd` is plain words naming a program the shell can exec as
/// they are: no shell syntax, no variable assignment in front and no
/// builtin such as `cd` (which `exec` cannot run).
pub fn is_simple(cmd: &str) -> bool {
    let plain = cmd
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || " \t_-./,:=+@%".contains(c));
    let Some(first) = cmd.split_whitespace().next() else {
        return false;
    };
    plain && !first.contains('=') && is_program(first)
}

/// A path, or a name found as an executable file in PATH.
fn is_program(word: &str) -> bool {
    word.contains('/') || program_path(word).is_some()
}

/// The file a command word runs: itself when it is a path, else the first
/// executable of that name in PATH.
pub fn program_path(word: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let exec = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if word.contains('/') {
        return Some(word.into());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(word))
        .find(|p| exec(p))
}

#[cfg(test)]
mod tests {
    use super::is_simple;

    #[test]
    fn only_plain_words_are_exec_d() {
        for c in [
            "python3 x.py",
            "/usr/bin/env A=1 prog --flag=2 a,b",
            "make -j4",
        ] {
            assert!(is_simple(c), "{c}");
        }
        for c in [
            "a; b",
            "a | b",
            "a && b",
            "a > f",
            "echo $HOME",
            "x 'q'",
            "(a)",
            "a &",
            "",
        ] {
            assert!(!is_simple(c), "{c}");
        }
    }
}
