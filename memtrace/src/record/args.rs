//! Command lines of `report`, `diff` and `annotate`.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

use super::annotate::Verdict;

#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// A file written with --record.
    pub file: PathBuf,
    /// Show only the N largest stacks of each report.
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
    /// Folded stacks (comm;outer;...;inner count), for flame-graph tools.
    #[arg(long, conflicts_with = "json")]
    pub folded: bool,
    /// JSON Lines: one object per stack.
    #[arg(long)]
    pub json: bool,
    /// One report summing every interval (default: each report as the live tool printed it).
    #[arg(long)]
    pub sum: bool,
    /// Also write a flame graph of the summed stacks to OUT (SVG).
    #[arg(long, value_name = "OUT")]
    pub svg: Option<PathBuf>,
    /// Also write the summed stacks to OUT as a gzip'd pprof profile
    /// (go tool pprof, Pyroscope, Parca, Grafana).
    #[arg(long, value_name = "OUT")]
    pub pprof: Option<PathBuf>,
    /// Also write the summed stacks to OUT as OpenTelemetry profiles (OTLP
    /// ProfilesData in protobuf; gzip'd when OUT ends in .gz).
    #[arg(long, value_name = "OUT")]
    pub otlp: Option<PathBuf>,
    /// Also send them to an OTLP/HTTP receiver (http://HOST[:PORT][/PATH];
    /// port 4318 and /v1development/profiles unless given).
    #[arg(long, value_name = "URL", value_parser = super::push::parse_url)]
    pub otlp_push: Option<super::push::Endpoint>,
    /// Print what the file says of its run instead (tool, arguments, kernel, host, build ids, totals).
    #[arg(long, conflicts_with_all = ["json", "folded", "svg", "pprof", "otlp", "otlp_push"])]
    pub info: bool,
    /// Keep identical stacks of different processes apart.
    #[arg(long)]
    pub per_pid: bool,
    #[command(flatten)]
    pub view: ViewArgs,
}

/// What report and diff share.
#[derive(Debug, Clone, Args)]
pub struct ViewArgs {
    /// Frames with their source file and line (where the record has them).
    #[arg(long, conflicts_with = "addresses")]
    pub lines: bool,
    /// Frames with their offsets (where the record has them).
    #[arg(long)]
    pub addresses: bool,
    /// The annotation database (default: $MEMTRACE_ANNOTATIONS, else memtrace-annotations.* here).
    #[arg(long, value_name = "PATH")]
    pub annotations: Option<PathBuf>,
    /// Also show stacks annotated `ignore` (and, in diff, those that did not change).
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SortBy {
    Count,
    Bytes,
}

#[derive(Debug, Clone, Args)]
pub struct DiffArgs {
    /// The earlier record (before).
    pub a: PathBuf,
    /// The later record (after).
    pub b: PathBuf,
    /// JSON Lines: one object per stack that changed.
    #[arg(long)]
    pub json: bool,
    /// Show only the N largest changes.
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
    /// Sort by the change in count (default) or in bytes.
    #[arg(long, value_enum, default_value_t = SortBy::Count)]
    pub by: SortBy,
    /// Also write a differential flame graph (B against A) to OUT (SVG).
    #[arg(long, value_name = "OUT")]
    pub svg: Option<PathBuf>,
    /// Draw the flame graph with the earlier run's widths: stacks that
    /// vanished show (the default, the later run's, cannot draw them).
    #[arg(long, requires = "svg")]
    pub reverse: bool,
    /// Compare records of different tools anyway (their counts are of
    /// different things: faults against calls, say).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub view: ViewArgs,
}

#[derive(Debug, Clone, Subcommand)]
pub enum AnnotateCmd {
    /// Adds (or replaces) the verdict and note of a stack of FILE.
    Add {
        /// A file written with --record.
        file: PathBuf,
        /// The stack id as memtrace shows it (or a unique prefix of it).
        stack_id: String,
        /// What to say of the stack.
        #[arg(long)]
        note: String,
        #[arg(long, value_enum, default_value_t = Verdict::Known)]
        verdict: Verdict,
        /// The annotation database (default: $MEMTRACE_ANNOTATIONS, else memtrace-annotations.* here, else memtrace-annotations.txt).
        #[arg(long, value_name = "PATH")]
        annotations: Option<PathBuf>,
    },
    /// Lists the annotations.
    List {
        #[arg(long, value_name = "PATH")]
        annotations: Option<PathBuf>,
    },
}
