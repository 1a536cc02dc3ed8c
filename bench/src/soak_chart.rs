//! The soak's PNG: each node's RSS against its memory budget (the warm-up shaded) above each
//! node's disk use, with the cluster's achieved commands/s. Pure Rust: plotters' bitmap
//! backend with a font embedded in a crate (no system font libraries).

use std::path::Path;
use std::sync::Once;

use plotters::coord::CoordTranslate;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use crate::soak::Sample;

pub(crate) const FONT: &str = "sans-serif";
const WIDTH: u32 = 1400;
const HEIGHT: u32 = 900;
const MB: f64 = 1_048_576.0;
const NODE_COLORS: [RGBColor; 3] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
];

static FONT_ONCE: Once = Once::new();

fn draw_error(error: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing the soak chart: {error}")
}

/// Registers the embedded font as [`FONT`], once per process, for every chart of the bench.
pub(crate) fn register_embedded_font() -> anyhow::Result<()> {
    let mut font = Ok(());
    FONT_ONCE.call_once(|| {
        font = register_font(FONT, FontStyle::Normal, epaint_default_fonts::HACK_REGULAR)
            .map_err(|_| anyhow::anyhow!("the embedded font could not be loaded"));
    });
    font
}

/// The legend of `chart` at `position`, in every bench chart's style.
pub(crate) fn draw_legend<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font((FONT, 13))
        .position(position)
        .draw()
}

pub fn draw(
    path: &Path,
    samples: &[Sample],
    budget_bytes: u64,
    warmup_s: u64,
    title: &str,
) -> anyhow::Result<()> {
    register_embedded_font()?;
    let end_s = samples.iter().map(|s| s.at_s).fold(1.0, f64::max);
    let nodes = samples.iter().map(|s| s.node).max().unwrap_or(0);
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let root = root.titled(title, (FONT, 20)).map_err(draw_error)?;
    let (upper, lower) = root.split_vertically(HEIGHT * 11 / 20);

    let rss_top = samples
        .iter()
        .map(|s| s.rss_bytes as f64 / MB)
        .fold(budget_bytes as f64 / MB, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&upper)
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..end_s, 0.0..rss_top)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .y_desc("RSS (MB)")
        .label_style((FONT, 13))
        .draw()
        .map_err(draw_error)?;
    chart
        .draw_series(std::iter::once(Rectangle::new(
            [(0.0, 0.0), (warmup_s as f64, rss_top)],
            RGBColor(235, 235, 235).filled(),
        )))
        .map_err(draw_error)?;
    chart
        .draw_series(LineSeries::new(
            [
                (0.0, budget_bytes as f64 / MB),
                (end_s, budget_bytes as f64 / MB),
            ],
            BLACK.stroke_width(2),
        ))
        .map_err(draw_error)?
        .label(format!("memory_budget_bytes ({} MB)", budget_bytes >> 20))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK));
    for node in 1..=nodes {
        let color = NODE_COLORS[(node - 1) % NODE_COLORS.len()];
        let points = samples
            .iter()
            .filter(|s| s.node == node)
            .map(|s| (s.at_s, s.rss_bytes as f64 / MB));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(draw_error)?
            .label(format!("node {node} RSS"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color));
    }
    draw_legend(&mut chart, SeriesLabelPosition::LowerRight).map_err(draw_error)?;

    let disk_top = samples
        .iter()
        .map(|s| s.disk_bytes as f64 / MB)
        .fold(1.0, f64::max)
        * 1.1;
    let rate_top = samples.iter().map(|s| s.commands_per_s).fold(1.0, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&lower)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .right_y_label_area_size(80)
        .build_cartesian_2d(0.0..end_s, 0.0..disk_top)
        .map_err(draw_error)?
        .set_secondary_coord(0.0..end_s, 0.0..rate_top);
    chart
        .configure_mesh()
        .x_desc("seconds since the load began")
        .y_desc("disk (MB)")
        .label_style((FONT, 13))
        .draw()
        .map_err(draw_error)?;
    chart
        .configure_secondary_axes()
        .y_desc("commands/s (cluster)")
        .label_style((FONT, 13))
        .draw()
        .map_err(draw_error)?;
    for node in 1..=nodes {
        let color = NODE_COLORS[(node - 1) % NODE_COLORS.len()];
        let points = samples
            .iter()
            .filter(|s| s.node == node)
            .map(|s| (s.at_s, s.disk_bytes as f64 / MB));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(draw_error)?
            .label(format!("node {node} disk"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color));
    }
    let rate = samples
        .iter()
        .filter(|s| s.node == 1)
        .map(|s| (s.at_s, s.commands_per_s));
    chart
        .draw_secondary_series(LineSeries::new(rate, RGBColor(150, 150, 150)))
        .map_err(draw_error)?
        .label("achieved commands/s")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RGBColor(150, 150, 150)));
    draw_legend(&mut chart, SeriesLabelPosition::UpperLeft).map_err(draw_error)?;
    root.present().map_err(draw_error)?;
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn a_chart_is_drawn_from_samples() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("soak.png");
        let samples: Vec<Sample> = (0..30)
            .flat_map(|i| {
                (1..=3).map(move |node| Sample {
                    at_s: f64::from(i) * 5.0,
                    node,
                    rss_bytes: (100 + u64::from(i as u32)) << 20,
                    disk_bytes: (10 * u64::from(i as u32)) << 20,
                    commands_per_s: 5_000.0,
                    cpu_s: f64::from(i),
                })
            })
            .collect();
        draw(&path, &samples, 256 << 20, 20, "test").expect("drawn");
        assert_drawn_png(&path);
    }

    /// A chart file is a PNG with something drawn on it.
    pub(crate) fn assert_drawn_png(path: &Path) {
        let bytes = std::fs::read(path).expect("written");
        assert!(bytes.starts_with(b"\x89PNG"), "a PNG");
        assert!(
            bytes.len() > 10_000,
            "with something on it: {} bytes",
            bytes.len()
        );
    }
}
