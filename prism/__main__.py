from prism.cli import run

run()
