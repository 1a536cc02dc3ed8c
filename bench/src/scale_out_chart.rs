//! The kernel scale-out PNG (`tally-bench scale-out-chart`), drawn from the results file
//! deploy/scale-out writes: tool calls per second against the number of kernel containers,
//! next to linear scaling from one kernel and the cluster's own limit for the same commands,
//! above the cores each group of containers used. The measurement itself is the script's (it
//! drives Docker); this only draws, so the chart looks like the bench's others.

use std::path::Path;

use plotters::prelude::*;
use serde::Deserialize;

use crate::soak_chart::{draw_legend, register_embedded_font, FONT};

const WIDTH: u32 = 1200;
const HEIGHT: u32 = 900;
const MEASURED: RGBColor = RGBColor(31, 119, 180);
const LINEAR: RGBColor = RGBColor(150, 150, 150);
const LIMIT: RGBColor = RGBColor(214, 39, 40);
const GROUP_COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(90, 90, 90),
];
/// The most runs one chart shows (deploy/scale-out runs 1, 2 and 4 kernels by default).
const MAX_RUNS: usize = 16;

/// deploy/scale-out's results file (the fields the chart needs).
#[derive(Debug, Deserialize)]
pub struct ScaleOutResults {
    /// Cores each kernel container may use.
    pub kernel_cpus: f64,
    /// The cores of the one machine everything ran on.
    pub machine_cores: f64,
    pub cluster_limit: ClusterLimit,
    pub runs: Vec<ScaleOutRun>,
}

/// `tally bench` with the kernels' commands, straight at the cluster.
#[derive(Debug, Deserialize)]
pub struct ClusterLimit {
    pub calls_per_s: f64,
}

/// One load through `kernels` kernel containers.
#[derive(Debug, Deserialize)]
pub struct ScaleOutRun {
    pub kernels: u32,
    pub calls_per_s: f64,
    /// Mean cores used during the run: all kernel containers, all node containers, the
    /// driver, and the whole machine (everything busy, Docker's own work included).
    pub kernel_cores: f64,
    pub node_cores: f64,
    pub driver_cores: f64,
    pub host_busy_cores: f64,
}

fn draw_error(error: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing the scale-out chart: {error}")
}

/// Reads `results` and draws `out`.
pub fn draw_file(results: &Path, out: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(results)
        .map_err(|e| anyhow::anyhow!("{}: {e}", results.display()))?;
    let results: ScaleOutResults = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}: not a scale-out results file: {e}", results.display()))?;
    anyhow::ensure!(
        !results.runs.is_empty() && results.runs.len() <= MAX_RUNS,
        "{} runs: a chart shows 1 to {MAX_RUNS}",
        results.runs.len()
    );
    draw(out, &results)
}

pub fn draw(path: &Path, results: &ScaleOutResults) -> anyhow::Result<()> {
    register_embedded_font()?;
    let mut runs: Vec<&ScaleOutRun> = results.runs.iter().collect();
    runs.sort_by_key(|r| r.kernels);
    let most_kernels = f64::from(runs.last().map_or(1, |r| r.kernels));
    let per_kernel = runs[0].calls_per_s / f64::from(runs[0].kernels.max(1));
    let top = runs
        .iter()
        .map(|r| r.calls_per_s)
        .chain([results.cluster_limit.calls_per_s, per_kernel * most_kernels])
        .fold(1.0, f64::max)
        * 1.15;
    let x_range = 0.5..most_kernels + 0.5;

    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let title = format!(
        "Kernel scale-out: tool calls/s through N kernels of {} core(s) each, one 3-node cluster",
        results.kernel_cpus
    );
    let root = root.titled(&title, (FONT, 20)).map_err(draw_error)?;
    let (upper, lower) = root.split_vertically(HEIGHT * 3 / 5);

    let mut chart = ChartBuilder::on(&upper)
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(80)
        .build_cartesian_2d(x_range.clone(), 0.0..top)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_labels(most_kernels as usize + 1)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("tool calls/s")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style((FONT, 13))
        .draw()
        .map_err(draw_error)?;
    chart
        .draw_series(LineSeries::new(
            [(1.0, per_kernel), (most_kernels, per_kernel * most_kernels)],
            LINEAR.stroke_width(2),
        ))
        .map_err(draw_error)?
        .label("linear from one kernel")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], LINEAR));
    let limit = results.cluster_limit.calls_per_s;
    chart
        .draw_series(LineSeries::new(
            [(0.5, limit), (most_kernels + 0.5, limit)],
            LIMIT.stroke_width(2),
        ))
        .map_err(draw_error)?
        .label(format!("the cluster's own limit ({limit:.0} calls/s)"))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], LIMIT));
    chart
        .draw_series(LineSeries::new(
            runs.iter().map(|r| (f64::from(r.kernels), r.calls_per_s)),
            MEASURED.stroke_width(3),
        ))
        .map_err(draw_error)?
        .label("measured through the kernels")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], MEASURED));
    chart
        .draw_series(
            runs.iter()
                .map(|r| Circle::new((f64::from(r.kernels), r.calls_per_s), 5, MEASURED.filled())),
        )
        .map_err(draw_error)?;
    draw_legend(&mut chart, SeriesLabelPosition::UpperLeft).map_err(draw_error)?;

    let groups: [(&str, fn(&ScaleOutRun) -> f64); 4] = [
        ("kernel containers", |r| r.kernel_cores),
        ("node containers", |r| r.node_cores),
        ("driver", |r| r.driver_cores),
        ("whole machine busy", |r| r.host_busy_cores),
    ];
    let cores_top = runs
        .iter()
        .flat_map(|r| groups.iter().map(move |(_, cores)| cores(r)))
        .fold(results.machine_cores, f64::max)
        * 1.2;
    let mut chart = ChartBuilder::on(&lower)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(x_range, 0.0..cores_top)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_labels(most_kernels as usize + 1)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .x_desc("kernel containers")
        .y_desc("cores used")
        .y_label_formatter(&|y| format!("{y:.1}"))
        .label_style((FONT, 13))
        .draw()
        .map_err(draw_error)?;
    let machine = results.machine_cores;
    chart
        .draw_series(DashedLineSeries::new(
            [(0.5, machine), (most_kernels + 0.5, machine)],
            6,
            4,
            BLACK.stroke_width(1),
        ))
        .map_err(draw_error)?
        .label(format!("the machine's {machine} cores"))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK));
    for (index, (name, cores)) in groups.iter().enumerate() {
        let color = GROUP_COLORS[index];
        chart
            .draw_series(LineSeries::new(
                runs.iter().map(|r| (f64::from(r.kernels), cores(r))),
                color.stroke_width(2),
            ))
            .map_err(draw_error)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color));
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperLeft).map_err(draw_error)?;
    root.present().map_err(draw_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_results_file_draws_a_png_and_a_wrong_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let results = dir.path().join("results.json");
        std::fs::write(
            &results,
            r#"{"kernel_cpus": 0.25, "machine_cores": 2, "cluster_limit": {"calls_per_s": 900.0},
                "runs": [
                  {"kernels": 1, "calls_per_s": 150.0, "kernel_cores": 0.25, "node_cores": 0.3, "driver_cores": 0.1, "host_busy_cores": 0.7},
                  {"kernels": 2, "calls_per_s": 290.0, "kernel_cores": 0.5, "node_cores": 0.5, "driver_cores": 0.2, "host_busy_cores": 1.2},
                  {"kernels": 4, "calls_per_s": 520.0, "kernel_cores": 1.0, "node_cores": 0.8, "driver_cores": 0.3, "host_busy_cores": 2.0}
                ]}"#,
        )
        .unwrap();
        let png = dir.path().join("scale-out.png");
        draw_file(&results, &png).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[1..4], b"PNG", "a PNG file");

        std::fs::write(&results, r#"{"kernel_cpus": 0.25, "machine_cores": 2, "cluster_limit": {"calls_per_s": 1.0}, "runs": []}"#).unwrap();
        let error = draw_file(&results, &dir.path().join("none.png")).unwrap_err();
        assert!(error.to_string().contains("0 runs"), "{error}");
        assert!(!dir.path().join("none.png").exists());
    }
}
