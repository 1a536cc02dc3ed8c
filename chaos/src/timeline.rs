//! The PNG timeline: operations by result over time, who led, and every fault as a bar.
//! Pure Rust: plotters' bitmap backend with ab_glyph text and a font embedded in a crate
//! (no system font libraries).

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use crate::history::{Op, OpResult};
use crate::report::RunReport;

const FONT: &str = "sans-serif";
const WIDTH: u32 = 1600;
const HEIGHT: u32 = 720;
/// Points drawn per result row; beyond it operations are sampled evenly.
const MAX_POINTS: usize = 20_000;

#[derive(Debug, thiserror::Error)]
pub enum TimelineError {
    #[error("the embedded font could not be loaded")]
    Font,
    #[error("drawing failed: {0}")]
    Draw(String),
}

fn draw_error(error: impl std::fmt::Display) -> TimelineError {
    TimelineError::Draw(error.to_string())
}

static FONT_ONCE: Once = Once::new();

fn register() -> Result<(), TimelineError> {
    let mut result = Ok(());
    FONT_ONCE.call_once(|| {
        result = register_font(FONT, FontStyle::Normal, epaint_default_fonts::HACK_REGULAR)
            .map_err(|_| TimelineError::Font);
    });
    result
}

/// Rows of the chart, bottom to top.
const ROWS: [&str; 5] = ["unknown", "failed", "ok", "leader 1/2/3", "faults"];

pub fn draw(path: &Path, report: &RunReport, history: &[Op]) -> Result<(), TimelineError> {
    register()?;
    let end_ms = history
        .iter()
        .map(|op| op.completed_ms)
        .chain(report.faults.iter().map(|f| f.end_ms))
        .chain(report.leader_samples.iter().map(|s| s.at_ms))
        .max()
        .unwrap_or(1_000)
        .max(1_000);
    let end_s = end_ms as f64 / 1_000.0;
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let verdict = if report.passed() { "PASS" } else { "FAIL" };
    let title = format!(
        "tally-chaos {verdict}: profile {} seed {}: {} ops, {} faults, {} leader changes, {} unknowns",
        report.profile,
        report.seed,
        report.ops.total,
        report.faults.len(),
        report.leader_changes,
        report.unknowns.total
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(90)
        .build_cartesian_2d(0.0..end_s, -0.5..(ROWS.len() as f64 - 0.5))
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc("seconds since start")
        .y_labels(ROWS.len())
        .y_label_formatter(&|y| {
            let row = y.round();
            if (y - row).abs() < 0.01 && row >= 0.0 && (row as usize) < ROWS.len() {
                ROWS[row as usize].to_owned()
            } else {
                String::new()
            }
        })
        .label_style((FONT, 14))
        .draw()
        .map_err(draw_error)?;

    let step = (history.len() / MAX_POINTS).max(1);
    let points = history.iter().step_by(step).map(|op| {
        let (row, color) = match op.result {
            OpResult::Ok { .. } => (2.0, GREEN.mix(0.5)),
            OpResult::Fail { .. } => (1.0, RED.mix(0.6)),
            OpResult::Info { .. } => (0.0, RGBColor(230, 140, 0).mix(0.9)),
        };
        let jitter = ((op.index * 7_919) % 61) as f64 / 61.0 * 0.6 - 0.3;
        Circle::new(
            (op.completed_ms as f64 / 1_000.0, row + jitter),
            2,
            color.filled(),
        )
    });
    chart.draw_series(points).map_err(draw_error)?;

    let leaders = report.leader_samples.iter().filter_map(|s| {
        s.leader.map(|l| {
            let y = 3.0 + (l as f64 - 2.0) * 0.25;
            Circle::new((s.at_ms as f64 / 1_000.0, y), 2, BLUE.filled())
        })
    });
    chart.draw_series(leaders).map_err(draw_error)?;

    let palette = [RED, MAGENTA, CYAN, BLUE, BLACK, RGBColor(120, 80, 0)];
    for (i, fault) in report.faults.iter().enumerate() {
        let color = palette[i % palette.len()];
        let (x0, x1) = (
            fault.start_ms as f64 / 1_000.0,
            fault.end_ms as f64 / 1_000.0,
        );
        let y = 3.65 + (i % 4) as f64 * 0.2;
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(x0, y), (x1.max(x0 + 0.05), y + 0.12)],
                color.mix(0.6).filled(),
            )))
            .map_err(draw_error)?;
        let label = serde_json::to_string(&fault.kind)
            .unwrap_or_default()
            .replace('"', "");
        chart
            .draw_series(std::iter::once(Text::new(
                label,
                (x0, y + 0.14),
                (FONT, 11).into_font().color(&color),
            )))
            .map_err(draw_error)?;
    }
    root.present().map_err(draw_error)?;
    Ok(())
}
