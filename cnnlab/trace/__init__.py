"""--trace: a run's spans of every thread, stream and kernel in the Chrome trace-event format (recorder.py), and
`cnnlab trace-plot`'s Gantt chart of them (plot.py). Imported only where a trace is asked for."""
