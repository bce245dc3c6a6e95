use clap::Parser;

/// Whether stdout was closed, looked at before Rust's runtime opens
/// /dev/null in its place (an `.init_array` entry runs before it).
#[used]
#[unsafe(link_section = ".init_array")]
static SEE_STDOUT: extern "C" fn() = see_stdout;

extern "C" fn see_stdout() {
    memtrace::output::note_closed_stdout();
}

fn main() {
    let cli = memtrace::cli::Cli::try_parse().unwrap_or_else(|e| usage_error(e));
    let code = match memtrace::cli::dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            if !e.quiet() {
                memtrace::output::to_stderr(format_args!("memtrace: error: {e}"));
            }
            e.exit_code()
        }
    };
    std::process::exit(code);
}

/// Help and version as clap prints them; a usage error in one line, exit 2.
fn usage_error(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit();
    }
    // The message and what it lists (the arguments missing), on one line;
    // not the usage and tips after it.
    let text = e.render().to_string();
    let said: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("tip:"))
        .collect();
    let line = said.join(" ");
    let line = line.strip_prefix("error: ").unwrap_or(&line);
    memtrace::output::to_stderr(format_args!("memtrace: error: {line} (--help says more)"));
    std::process::exit(2);
}
