//! The regions bench's PNG: acknowledged writes per second from each region's callers around
//! the cut (the cut window shaded), above the region of the leader over time.

use std::path::Path;

use plotters::prelude::*;

use crate::soak_chart::{draw_legend, register_embedded_font, FONT};

const WIDTH: u32 = 1400;
const HEIGHT: u32 = 800;
const REGION_COLORS: [RGBColor; 3] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
];
/// Width of one bar of the write rate.
pub const BIN_S: f64 = 0.25;

fn draw_error(error: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing the regions chart: {error}")
}

/// What the chart shows.
pub struct Timeline<'a> {
    pub regions: &'a [&'a str],
    /// Per region, the times (s since the epoch) of its acknowledged writes.
    pub acked_at_s: Vec<Vec<f64>>,
    /// Leader samples: (s since the epoch, the leader's region index, if any leader).
    pub leader: &'a [(f64, Option<usize>)],
    pub cut_at_s: f64,
    pub heal_at_s: f64,
    pub end_s: f64,
    pub title: &'a str,
}

pub fn draw(path: &Path, timeline: &Timeline<'_>) -> anyhow::Result<()> {
    register_embedded_font()?;
    let bins = (timeline.end_s / BIN_S).ceil() as usize + 1;
    let rates: Vec<Vec<f64>> = timeline
        .acked_at_s
        .iter()
        .map(|times| {
            let mut counts = vec![0.0; bins];
            for at in times {
                let bin = ((at / BIN_S) as usize).min(bins - 1);
                counts[bin] += 1.0 / BIN_S;
            }
            counts
        })
        .collect();
    let rate_top = rates.iter().flatten().copied().fold(1.0, f64::max) * 1.15;
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let root = root
        .titled(timeline.title, (FONT, 20))
        .map_err(draw_error)?;
    let (upper, lower) = root.split_vertically(HEIGHT * 3 / 5);
    let mut chart = ChartBuilder::on(&upper)
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..timeline.end_s, 0.0..rate_top)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .y_desc("acknowledged writes/s")
        .label_style((FONT, 13))
        .draw()
        .map_err(draw_error)?;
    chart
        .draw_series(std::iter::once(Rectangle::new(
            [(timeline.cut_at_s, 0.0), (timeline.heal_at_s, rate_top)],
            RGBColor(240, 225, 225).filled(),
        )))
        .map_err(draw_error)?
        .label("leader's region cut off")
        .legend(|(x, y)| {
            Rectangle::new(
                [(x, y - 5), (x + 20, y + 5)],
                RGBColor(240, 225, 225).filled(),
            )
        });
    for (region, counts) in rates.iter().enumerate() {
        let color = REGION_COLORS[region % REGION_COLORS.len()];
        let points = counts
            .iter()
            .enumerate()
            .map(|(bin, rate)| (bin as f64 * BIN_S, *rate));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(draw_error)?
            .label(format!("callers in {}", timeline.regions[region]))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color));
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight).map_err(draw_error)?;

    let regions = timeline.regions.len() as f64;
    let mut chart = ChartBuilder::on(&lower)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..timeline.end_s, -1.5..regions - 0.5)
        .map_err(draw_error)?;
    let names = timeline.regions;
    chart
        .configure_mesh()
        .x_desc("seconds since the failover load began")
        .y_desc("leader's region")
        .y_labels(names.len() + 2)
        .y_label_formatter(&|y| {
            let index = y.round();
            if (y - index).abs() > 0.01 {
                String::new()
            } else if index < 0.0 {
                "none".to_owned()
            } else {
                names
                    .get(index as usize)
                    .map_or(String::new(), |n| (*n).to_owned())
            }
        })
        .label_style((FONT, 13))
        .draw()
        .map_err(draw_error)?;
    chart
        .draw_series(std::iter::once(Rectangle::new(
            [
                (timeline.cut_at_s, -1.5),
                (timeline.heal_at_s, regions - 0.5),
            ],
            RGBColor(240, 225, 225).filled(),
        )))
        .map_err(draw_error)?;
    chart
        .draw_series(timeline.leader.iter().map(|(at, region)| {
            let y = region.map_or(-1.0, |r| r as f64);
            let color = region.map_or(BLACK, |r| REGION_COLORS[r % REGION_COLORS.len()]);
            Circle::new((*at, y), 3, color.filled())
        }))
        .map_err(draw_error)?;
    root.present().map_err(draw_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_is_drawn_from_a_timeline() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("regions.png");
        let acked_at_s = (0..3)
            .map(|region| {
                (0..400)
                    .map(|i| f64::from(i) * 0.1 + f64::from(region) * 0.01)
                    .collect()
            })
            .collect();
        let leader: Vec<(f64, Option<usize>)> = (0..400)
            .map(|i| {
                (
                    f64::from(i) * 0.1,
                    if (100..120).contains(&i) {
                        None
                    } else {
                        Some(i as usize % 2)
                    },
                )
            })
            .collect();
        let timeline = Timeline {
            regions: &["east", "central", "west"],
            acked_at_s,
            leader: &leader,
            cut_at_s: 10.0,
            heal_at_s: 30.0,
            end_s: 40.0,
            title: "test",
        };
        draw(&path, &timeline).expect("drawn");
        crate::soak_chart::tests::assert_drawn_png(&path);
    }
}
