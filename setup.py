"""Maps the top-level pipeline folders into the byoc package (see pyproject.toml)."""
import os

from setuptools import setup

MAPPED = {"byoc": "byoc", "byoc.backends": "backends", "byoc.templates": "templates",
          "byoc.build_configs": "build_configs"}


def find_packages_mapped():
    packages = []
    for package, folder in MAPPED.items():
        for root, dirs, files in os.walk(folder):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            if "__init__.py" in files:
                rel = os.path.relpath(root, folder)
                packages.append(package if rel == "." else package + "." + rel.replace(os.sep, "."))
    return packages


setup(packages=find_packages_mapped(), package_dir=MAPPED)
