"""Running a method of this project as a Flower app (optional: ``pip install -e .[flower]``)."""
