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
    let cli = memtrace::cli::Cli::parse();
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
