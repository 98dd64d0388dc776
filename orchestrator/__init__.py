"""Sweeps end to end: sweep/ defines, run/ runs on Ray, store/ keeps, analysis/ reads, cli/."""
