__version__ = '1.3.1'
debug = False
cuda = '10.1'
git_version = 'ee77ccbb6da4e2efd83673e798acf7081bc03564'
