"""What a person looks at beside the JSON: SVG charts, the HTML helpers, the export and optimization reports, the
run page with its index, and the statistics page. Imported by the Exporter and the run summary alike."""
