use clap::Parser;

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
