//! Aligned tables for people, JSON for scripts, and the exit code of a command's outcome.

use serde::Serialize;

use crate::Outcome;

pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    pub fn render(&self, with_header: bool) -> String {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(String::len).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.len());
            }
        }
        let line = |cells: &[String]| {
            let padded: Vec<String> = cells
                .iter()
                .enumerate()
                .take(columns)
                .map(|(i, c)| format!("{c:<width$}", width = widths[i]))
                .collect();
            padded.join("  ").trim_end().to_owned()
        };
        let mut out = Vec::new();
        if with_header {
            out.push(line(&self.header));
        }
        out.extend(self.rows.iter().map(|r| line(r)));
        out.join("\n")
    }

    pub fn print(&self) {
        self.print_with_header(true);
    }

    pub fn print_with_header(&self, with_header: bool) {
        let text = self.render(with_header);
        if !text.is_empty() {
            println!("{text}");
        }
    }
}

pub fn print_json<T: Serialize + ?Sized>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => println!("{text}"),
        Err(error) => eprintln!("cannot render JSON: {error}"),
    }
}

/// Prints an outcome and returns the exit code for it (see the CLI's exit codes).
pub fn print_decision_outcome(outcome: &Outcome, json: bool) -> u8 {
    let code = match outcome {
        Outcome::Decided(_) => 0,
        Outcome::Refused(_) | Outcome::Unavailable { .. } | Outcome::NotApplied { .. } => 3,
        Outcome::Unknown { .. } => 4,
    };
    if json {
        let value = match outcome {
            Outcome::Decided(decision) => {
                serde_json::json!({ "outcome": "decided", "decision": decision })
            }
            Outcome::Refused(error) => {
                serde_json::json!({ "outcome": "refused", "error": error, "message": error.to_string() })
            }
            Outcome::Unavailable { reason } => {
                serde_json::json!({ "outcome": "unavailable", "reason": reason })
            }
            Outcome::NotApplied { event_id } => {
                serde_json::json!({ "outcome": "not_applied", "event_id": event_id })
            }
            Outcome::Unknown { event_id, reason } => {
                serde_json::json!({ "outcome": "unknown", "event_id": event_id, "reason": reason })
            }
        };
        print_json(&value);
        return code;
    }
    match outcome {
        Outcome::Decided(d) => {
            let index = d
                .commit_index
                .map_or_else(|| "-".to_owned(), |i| i.0.to_string());
            let log = d
                .log_id
                .map_or_else(|| "-".to_owned(), |l| format!("{}.{}", l.term, l.index));
            println!("{:?}", d.outcome);
            println!(
                "event {}  commit index {index}  log {log}{}",
                d.event_id,
                if d.replayed { "  (replayed)" } else { "" }
            );
        }
        Outcome::Refused(error) => println!("refused: {error}"),
        Outcome::Unavailable { reason } => println!("not applied (no leader took it): {reason}"),
        Outcome::NotApplied { event_id } => {
            println!("not applied: {event_id} is tombstoned and can never apply")
        }
        Outcome::Unknown { event_id, reason } => {
            println!("UNKNOWN outcome for {event_id}: {reason}\nthis is not a no: run `tally resolve` with the same arguments")
        }
    }
    code
}

#[cfg(test)]
mod tests {
    use super::Table;

    #[test]
    fn tables_align_columns() {
        let mut table = Table::new(&["A", "LONGER"]);
        table.row(vec!["wide value".into(), "x".into()]);
        insta::assert_snapshot!(table.render(true), @r"
        A           LONGER
        wide value  x
        ");
    }
}
