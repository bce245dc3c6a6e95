//! Command line: shared arguments are flattened into every tool.

use clap::{Parser, Subcommand};

pub use crate::run::args::*;
pub use crate::stacks::args::*;

#[derive(Debug, Parser)]
#[command(
    name = "memtrace",
    version,
    about = "Who is eating memory, from which code path, and who got OOM-killed",
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Command,
}

#[derive(Debug, Subcommand)]
// Parsed once per run: the size of the largest tool's arguments does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    #[command(flatten)]
    Tool(crate::tools::ToolCommand),
    /// What this kernel supports and how each tool would attach here.
    Doctor,
    /// Reads a file written with --record: the live tool's views, summed or per interval, and flame graphs.
    Report(crate::record::args::ReportArgs),
    /// Compares two records: stacks that appeared, vanished, grew or shrank.
    Diff(crate::record::args::DiffArgs),
    /// Verdicts and notes on stacks, applied by report and diff.
    #[command(subcommand)]
    Annotate(crate::record::args::AnnotateCmd),
}

/// Runs what the command line asks for; the exit code.
pub fn dispatch(cli: Cli) -> crate::error::Result<i32> {
    match cli.cmd {
        Command::Tool(t) => {
            let (mut tool, common) = t.build()?;
            crate::run::run(tool.as_mut(), common)
        }
        Command::Doctor => crate::doctor::doctor(),
        Command::Report(a) => crate::record::report::run(&a),
        Command::Diff(a) => crate::record::diff::run(&a),
        Command::Annotate(a) => crate::record::annotate(&a),
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    #[test]
    fn every_tool_is_a_subcommand_named_and_described_by_its_about() {
        let cli = super::Cli::command();
        let subs: Vec<(String, String)> = cli
            .get_subcommands()
            .map(|c| {
                let about = c.get_about().map(|a| a.to_string()).unwrap_or_default();
                (c.get_name().to_string(), about)
            })
            .collect();
        assert_eq!(crate::tools::NAMES.len(), 17);
        for name in crate::tools::NAMES {
            let (_, about) = subs
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("no subcommand {name}: {subs:?}"));
            assert!(
                !about.is_empty() && !about.ends_with('.'),
                "{name}: {about:?}"
            );
        }
        let oomkill = subs.iter().find(|(n, _)| n == "oomkill").unwrap();
        assert_eq!(
            oomkill.1,
            "OOM kills: trigger, victim, RSS, memcg, pages considered"
        );
        // Parsed back to the tool the name says.
        let parsed = super::Cli::try_parse_from(["memtrace", "top", "-p", "1"]).unwrap();
        match parsed.cmd {
            super::Command::Tool(t) => assert_eq!(t.build().unwrap().0.name(), "top"),
            _ => panic!("top parsed as something else"),
        }
    }
}
