"""Maps the top-level pipeline folders into the byoc package (see pyproject.toml).

Data files (templates, configs, shim sources) may sit in folders that are not Python
packages (templates/builtin/, backends/builtin/shim/cuda/): each file is listed under the
nearest enclosing package, so a non-editable install carries all of them.
"""
import os

from setuptools import setup

MAPPED = {"byoc": "byoc", "byoc.backends": "backends", "byoc.templates": "templates",
          "byoc.build_configs": "build_configs"}
DATA_SUFFIXES = (".j2", ".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh", ".yaml", ".json", ".S")


def packages_and_data():
    packages, package_data = [], {}
    for package, folder in MAPPED.items():
        owner = {}  # folder -> the package that owns the files in it
        for root, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            rel = os.path.relpath(root, folder)
            if "__init__.py" in files:
                name = package if rel == "." else package + "." + rel.replace(os.sep, ".")
                packages.append(name)
                owner[root] = (name, root)
            else:
                owner[root] = owner[os.path.dirname(root)]
            name, package_root = owner[root]
            for file in sorted(files):
                if file.endswith(DATA_SUFFIXES):
                    path = os.path.relpath(os.path.join(root, file), package_root)
                    package_data.setdefault(name, []).append(path.replace(os.sep, "/"))
    return packages, package_data


PACKAGES, PACKAGE_DATA = packages_and_data()
setup(packages=PACKAGES, package_dir=MAPPED, package_data=PACKAGE_DATA)
