//! The full-screen face of `top` (ratatui over crossterm): the table, the
//! sort keys, a filter typed after `/`, Enter for one process's totals, q
//! to quit. Keys arrive on stdin, which `run` watches for us.

use std::io::Stdout;
use std::time::Duration;

use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::crossterm::{execute, terminal};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Row, Table, TableState};
use ratatui::Terminal;

use super::narrow::{self, Cells};
use super::table::{self, Filter, SortKey};
use crate::error::{Error, Result};
use crate::output::Value;
use crate::probes::snapshot::Snapshot;

#[derive(Default)]
pub struct Screen {
    term: Option<Terminal<CrosstermBackend<Stdout>>>,
    /// Entered, and not yet left: the screen is taken at the first draw,
    /// after the banner, which would otherwise stay in cells ratatui
    /// believes blank.
    entered: bool,
    left: bool,
    /// Typing a filter after `/`.
    editing: bool,
    selected: usize,
    /// The pid whose totals are open (Enter).
    detail: Option<u32>,
    /// Pids in the order last drawn, for the selection.
    shown: Vec<u32>,
}

/// What a batch of keys asks for.
#[derive(Default)]
pub struct Act {
    pub quit: bool,
    pub redraw: bool,
}

fn io(e: std::io::Error) -> Error {
    Error::Io(e)
}

/// Names from the traced system are untrusted: a control character in a
/// command name must not reach the terminal.
fn clean(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn text(v: &Value) -> String {
    match v {
        Value::U(n) => n.to_string(),
        Value::I(n) => n.to_string(),
        Value::F(x, d) => format!("{x:.d$}"),
        Value::S(s) => clean(s),
        Value::B(_) => v.to_string(),
        Value::Null => "-".into(),
    }
}

impl Screen {
    fn enter(&mut self) -> Result<()> {
        self.entered = true;
        terminal::enable_raw_mode().map_err(io)?;
        execute!(std::io::stdout(), terminal::EnterAlternateScreen).map_err(io)?;
        let mut t = Terminal::new(CrosstermBackend::new(std::io::stdout())).map_err(io)?;
        t.hide_cursor().map_err(io)?;
        t.clear().map_err(io)?;
        self.term = Some(t);
        Ok(())
    }

    /// Gives the terminal back as it was; safe to call twice.
    pub fn leave(&mut self) {
        self.left = true;
        if let Some(mut t) = self.term.take() {
            let _ = t.show_cursor();
            let _ = execute!(std::io::stdout(), terminal::LeaveAlternateScreen);
            let _ = terminal::disable_raw_mode();
        }
    }

    /// The pid whose details are open.
    pub fn detail(&self) -> Option<u32> {
        self.detail
    }

    /// `stacks`: lines for the open process's details.
    pub fn draw(
        &mut self,
        snap: &mut Snapshot,
        sort: SortKey,
        filter: &Filter,
        stacks: &[String],
    ) -> Result<()> {
        if !self.entered && !self.left {
            self.enter()?;
        }
        let Some(term) = self.term.as_mut() else {
            return Ok(());
        };
        let size = term.size().map_err(io)?;
        let height = size.height as usize;
        let procs = table::select(snap, sort, filter, height.saturating_sub(6).max(1));
        self.shown = procs.iter().map(|p| p.pid).collect();
        self.selected = self.selected.min(self.shown.len().saturating_sub(1));
        let values: Vec<crate::output::Row> = procs.iter().map(|p| table::row(snap, p)).collect();
        // Each column as wide as its widest cell: on a narrow terminal the
        // numbers take units (206M) and whole columns go by priority, never
        // digits of a number (205,700 was once shown as 2057).
        let is_text = |i: usize| table::COLS[i].left;
        let n = table::COLS.len();
        let full = Cells::new(
            n,
            &values,
            |_, v| text(v),
            |i| table::COLS[i].header,
            is_text,
        );
        let short = Cells::new(
            n,
            &values,
            |i, v| narrow::cell(v, table::SHORT[i].0, text),
            |i| table::SHORT[i].1,
            is_text,
        );
        let width = size.width as usize;
        let (t, cols) = {
            let f = table::fit(&full.need, width, sort);
            let s = table::fit(&short.need, width, sort);
            if s.len() > f.len() {
                (short, s)
            } else {
                (full, f)
            }
        };
        let hidden = table::COLS.len() - cols.len();
        let need = &t.need;
        let rows: Vec<Row> = t
            .cells
            .iter()
            .map(|r| Row::new(cols.iter().map(|&i| r[i].clone()).collect::<Vec<_>>()))
            .collect();
        // The last column shown (CGROUP when it fits) takes what is left.
        let widths: Vec<Constraint> = cols
            .iter()
            .enumerate()
            .map(|(n, &i)| match n + 1 == cols.len() {
                true => Constraint::Min(need[i] as u16),
                false => Constraint::Length(need[i] as u16),
            })
            .collect();
        let header = Row::new(cols.iter().map(|&i| t.headers[i]))
            .style(Style::default().add_modifier(Modifier::REVERSED));
        // What is hidden first: a narrow terminal cuts the line's end.
        let status = format!(
            "memtrace top  {}{}  {} processes  every {:.1}s  sort: {}  filter: {}{}",
            crate::output::clock(),
            match hidden {
                0 => String::new(),
                n => format!("  ({n} columns hidden: widen the terminal)"),
            },
            snap.procs.len(),
            snap.elapsed.as_secs_f64(),
            sort.label(),
            if filter.0.is_empty() {
                "-".into()
            } else {
                clean(&filter.0)
            },
            if self.editing { "_" } else { "" },
        );
        let ooms: Vec<Line> = snap
            .recent_ooms
            .iter()
            .rev()
            .take(1)
            .map(|k| {
                Line::styled(
                    format!(
                        "OOM kill: pid {} ({}) in {}, {} kB anon; {} kills so far",
                        k.victim_pid,
                        clean(&k.victim_comm),
                        clean(&k.cgroup),
                        k.anon_rss_kb,
                        snap.ooms
                    ),
                    Style::default().fg(Color::Red),
                )
            })
            .collect();
        let detail = self
            .detail
            .and_then(|pid| snap.procs.get(&pid))
            .map(|p| {
                let t = &p.total;
                format!(
                    "pid {} ({})  cgroup {}\nsince memtrace started:\n  page faults {} user, {} kernel\n  file faults {}\n  brk calls {} ({} kB grown)\n  mmap calls {} ({} kB asked)\n  reclaim stall {:.2} ms\nRSS: anon {} kB, file {} kB, shmem {} kB\n(Enter or Esc closes; stacks load once opened)",
                    p.pid, clean(&p.comm), clean(&p.cgroup), t.faults_user, t.faults_kernel, t.file_faults,
                    t.brk_calls, t.brk_bytes >> 10, t.mmap_calls, t.mmap_bytes >> 10,
                    t.reclaim_ns as f64 / 1e6, p.rss_anon() >> 10, p.rss_file() >> 10, p.rss_shmem() >> 10
                )
            })
            .map(|d| {
                let mut d = d;
                for l in stacks {
                    d.push('\n');
                    d.push_str(&clean(l));
                }
                d
            });
        let memory = crate::process::proc::memory_line();
        let keys = table::keys_line(sort);
        let mut state = TableState::default().with_selected(Some(self.selected));
        term.draw(|f| {
            let [top, mem, oom, body, foot] = Layout::vertical([
                Constraint::Length(1),
                Constraint::Length(1),
                Constraint::Length(ooms.len() as u16),
                Constraint::Min(1),
                Constraint::Length(1),
            ])
            .areas(f.area());
            f.render_widget(Paragraph::new(status), top);
            f.render_widget(Paragraph::new(memory.as_str()), mem);
            f.render_widget(Paragraph::new(ooms), oom);
            let t = Table::new(rows, widths)
                .header(header)
                .row_highlight_style(Style::default().add_modifier(Modifier::BOLD));
            f.render_stateful_widget(t, body, &mut state);
            f.render_widget(Paragraph::new(keys), foot);
            if let Some(d) = detail {
                let [_, mid, _] = Layout::vertical([
                    Constraint::Fill(1),
                    Constraint::Length(d.lines().count() as u16 + 2),
                    Constraint::Fill(1),
                ])
                .areas(body);
                f.render_widget(Clear, mid);
                f.render_widget(
                    Paragraph::new(d)
                        .block(Block::default().borders(Borders::ALL).title("process")),
                    mid,
                );
            }
        })
        .map_err(io)?;
        Ok(())
    }

    /// Reads the keys waiting on stdin.
    pub fn keys(&mut self, sort: &mut SortKey, filter: &mut Filter) -> Result<Act> {
        let mut act = Act::default();
        while event::poll(Duration::ZERO).map_err(io)? {
            let Event::Key(k) = event::read().map_err(io)? else {
                act.redraw = true;
                continue;
            };
            if k.kind != KeyEventKind::Press {
                continue;
            }
            act.redraw = true;
            if k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL) {
                act.quit = true;
                break;
            }
            if self.editing {
                match k.code {
                    KeyCode::Char(c) => filter.0.push(c),
                    KeyCode::Backspace => {
                        filter.0.pop();
                    }
                    KeyCode::Enter | KeyCode::Esc => self.editing = false,
                    _ => {}
                }
                continue;
            }
            match k.code {
                KeyCode::Char('q') => {
                    act.quit = true;
                    break;
                }
                KeyCode::Char('/') => {
                    self.editing = true;
                    filter.0.clear();
                }
                KeyCode::Up => self.selected = self.selected.saturating_sub(1),
                KeyCode::Down => self.selected += 1,
                KeyCode::Enter => {
                    self.detail = match self.detail {
                        Some(_) => None,
                        None => self.shown.get(self.selected).copied(),
                    }
                }
                KeyCode::Esc => self.detail = None,
                KeyCode::Char(c) => {
                    if let Some(s) = SortKey::from_key(c) {
                        *sort = s;
                    }
                }
                _ => {}
            }
        }
        Ok(act)
    }
}

impl Drop for Screen {
    /// An error on the way out must not leave the terminal raw.
    fn drop(&mut self) {
        self.leave();
    }
}
