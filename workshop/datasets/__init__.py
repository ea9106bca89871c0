"""The labs' data sources (`workshop.spec.DataSource`): prepared locally as SageMaker channels,
uploaded once per user to S3.

- `mnist`: MNIST `train`/`test` (labs 1-3): the full set when it can be downloaded, else the
  5,000-digit subset that ships in a wheel; `python -m workshop.datasets mnist DIR`.
- `corpus`: CPython's own reference documentation as a text corpus (lab 4), no download.
- `local`: the channels of a script of your own (`workshop.script_mode`): local folders and files, or S3 URIs.
"""
