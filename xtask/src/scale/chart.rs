//! results/scale.png: what the agent took and how fast it was, against the
//! cluster's pods (log scale), one panel each, with the targets
//! and the published figures the page cites drawn in.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::{
    BLACK, BitMapBackend, ChartBuilder, Circle, Color, DrawingArea, IntoDrawingArea, IntoLogRange,
    LineSeries, PathElement, RGBColor, Text, WHITE,
};
use serde_json::Value;

const MEASURED: RGBColor = RGBColor(46, 139, 87);
const SECOND: RGBColor = RGBColor(70, 110, 190);
const TARGET: RGBColor = RGBColor(200, 40, 40);
const PUBLISHED: RGBColor = RGBColor(230, 140, 40);

/// One panel: a title, the y axis, the measured series (label, field
/// path in a row, factor to the axis's unit, colour) and the reference
/// marks (label, pods or None for a horizontal line, value, colour).
struct Panel<'a> {
    title: &'a str,
    unit: &'a str,
    series: Vec<(&'a str, Vec<&'a str>, f64, RGBColor)>,
    references: Vec<(&'a str, Option<f64>, f64, RGBColor)>,
}

fn at(row: &Value, path: &[&str]) -> Option<f64> {
    path.iter()
        .try_fold(row, |v, key| v.get(*key))
        .and_then(Value::as_f64)
}

pub fn chart(rows: &[Value], path: &Path) -> anyhow::Result<()> {
    crate::bench::chart::register_font()?;
    let root = BitMapBackend::new(path, (1200, 820)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = [
        Panel {
            title: "agent memory (RSS under churn)",
            unit: "MiB",
            series: vec![(
                "flatnet",
                vec!["churn", "rss_bytes"],
                1.0 / 1048576.0,
                MEASURED,
            )],
            references: vec![
                ("target 200 MiB", None, 200.0, TARGET),
                (
                    "Cilium, 50,000 pods: 438 MiB",
                    Some(50_000.0),
                    438.0,
                    PUBLISHED,
                ),
            ],
        },
        Panel {
            title: "agent CPU (share of a core)",
            unit: "%",
            series: vec![
                ("under churn", vec!["churn", "cpu_share"], 100.0, MEASURED),
                ("idle", vec!["idle", "cpu_share"], 100.0, SECOND),
            ],
            references: vec![("idle target 0.2%", None, 0.2, TARGET)],
        },
        Panel {
            title: "network programming latency p99",
            unit: "ms",
            series: vec![
                (
                    "end to end",
                    vec!["latency", "network_programming", "p99_ms"],
                    1.0,
                    MEASURED,
                ),
                (
                    "agent's part",
                    vec!["latency", "endpoint_slice_to_maps", "p99_ms"],
                    1.0,
                    SECOND,
                ),
            ],
            references: vec![("target 1 s", None, 1000.0, TARGET)],
        },
        Panel {
            title: "policy implementation latency",
            unit: "ms",
            series: vec![
                (
                    "p99",
                    vec!["latency", "policy_implementation", "p99_ms"],
                    1.0,
                    MEASURED,
                ),
                (
                    "p50",
                    vec!["latency", "policy_implementation", "p50_ms"],
                    1.0,
                    SECOND,
                ),
            ],
            references: vec![
                ("p99 target 100 ms", None, 100.0, TARGET),
                (
                    "Cilium p99, 30,000 policies: 317 ms",
                    Some(150_000.0),
                    317.0,
                    PUBLISHED,
                ),
            ],
        },
    ];
    let areas = root.split_evenly((2, 2));
    for (area, panel) in areas.iter().zip(&panels) {
        draw(area, panel, rows)?;
    }
    root.present()?;
    Ok(())
}

fn draw(
    area: &DrawingArea<BitMapBackend, Shift>,
    panel: &Panel,
    rows: &[Value],
) -> anyhow::Result<()> {
    let points = |path: &[&str], factor: f64| -> Vec<(f64, f64)> {
        rows.iter()
            .filter_map(|row| Some((at(row, &["pods"])?, at(row, path)? * factor)))
            .collect()
    };
    let top = panel
        .series
        .iter()
        .flat_map(|(_, path, factor, _)| points(path, *factor))
        .map(|(_, y)| y)
        .chain(panel.references.iter().map(|(_, _, y, _)| *y))
        .fold(0.0_f64, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(panel.title, ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d((1_000f64..200_000f64).log_scale(), 0f64..top.max(1.0))?;
    chart
        .configure_mesh()
        .x_desc("pods in the cluster")
        .y_desc(panel.unit)
        .label_style(("sans-serif", 13))
        .draw()?;
    for (label, path, factor, color) in &panel.series {
        let series = points(path, *factor);
        chart
            .draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))?
            .label(*label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
        chart.draw_series(series.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
    }
    for (label, pods, value, color) in &panel.references {
        match pods {
            None => {
                chart
                    .draw_series(LineSeries::new(
                        [(1_000.0, *value), (200_000.0, *value)],
                        color.stroke_width(1),
                    ))?
                    .label(*label)
                    .legend(move |(x, y)| {
                        PathElement::new([(x, y), (x + 18, y)], color.stroke_width(1))
                    });
            }
            Some(pods) => {
                chart.draw_series(std::iter::once(Circle::new(
                    (*pods, *value),
                    5,
                    color.filled(),
                )))?;
                chart.draw_series(std::iter::once(Text::new(
                    label.to_string(),
                    (*pods * 0.1, *value * 1.04),
                    ("sans-serif", 12),
                )))?;
            }
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .draw()?;
    Ok(())
}
