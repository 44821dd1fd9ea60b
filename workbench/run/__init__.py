"""One run: probe -> teacher targets -> every student -> files, on one process or several."""
