"""Build hook: generates turnstile_client._proto from the protos (protogen.py) before the modules are
collected, and puts a copy of the protos into the sdist so it builds away from the repository."""

import shutil
import sys
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import protogen  # noqa: E402


class BuildPyWithProtos(build_py):
    def run(self):
        protogen.generate(protogen.proto_root(None))
        # setup() found the packages before this ran: in a fresh checkout turnstile_client._proto did not
        # exist yet, so find them again or the wheel would leave the generated modules out.
        self.packages = self.distribution.packages = find_packages(str(protogen.HERE / "src"))
        super().run()


class SdistWithProtos(sdist):
    def run(self):
        root = protogen.proto_root(None)
        copy = protogen.HERE / "proto"
        if root != copy:
            shutil.rmtree(copy, ignore_errors=True)
            for f in protogen.proto_files(root):
                (copy / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / f, copy / f)
        super().run()


setup(cmdclass={"build_py": BuildPyWithProtos, "sdist": SdistWithProtos})
